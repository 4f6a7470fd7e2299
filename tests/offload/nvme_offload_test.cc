// NvmeOffload (Note [NVMe offload setup]) with real swap directories and files: one
// directory per distinct nvme_path however it is spelt, the files sized by the swappers'
// formulas, the stores' swappers in place and usable, nothing made when nothing is on NVMe,
// and no directory for a shape-only setup.
#include "offload/nvme_offload.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/config.h"
#include "core/memory_tracker.h"
#include "estimate/shape_only.h"
#include "io_test_util.h"
#include "kernels/ops.h"
#include "offload/optimizer_swapper.h"
#include "offload/param_swapper.h"

namespace ztrain::offload {
namespace {

using test_util::TempDir;

const std::vector<int64_t> kShards = {300, 500};
const std::vector<int64_t> kRanges = {300, 500};

class NvmeOffloadTest : public ::testing::Test {
 protected:
  // A setup with the placement `at` and the given nvme paths, its stores fresh.
  std::unique_ptr<NvmeOffload> Make(const Placement& at, const std::string& param_path,
                                    const std::string& opt_path, bool computes = true) {
    ZeroConfig zero;
    zero.offload_param.nvme_path = param_path;
    zero.offload_optimizer.nvme_path = opt_path;
    zero.offload_param.buffer_size = 1000;
    zero.offload_param.max_in_cpu = 0;
    zero.sub_group_size = 256;
    // A shape-only setup has shape-only allocators, as the engine's (Note [Shape-only engine]).
    Allocator& memory = computes ? static_cast<Allocator&>(host_) : shape_only_;
    auto allocate = [&memory](Place, int64_t n, MemoryCategory c, DType d) {
      Buffer b(memory, d, {n}, c);
      if (b.holds_data()) b.Zero();
      return b;
    };
    params_ =
        std::make_unique<ParamStore>(ParamStore::Options{.placement = at, .computes = computes},
                                     *ops_, memory, memory, allocate);
    moments_ = std::make_unique<OptimizerStateStore>(at.optimizer, *ops_, allocate, computes);
    for (size_t l = 0; l < kShards.size(); ++l) {
      params_->AddLayer({.padded = 2 * kShards[l],
                         .shard = kShards[l],
                         .opt_begin = kShards[l],
                         .opt_len = kRanges[l],
                         .sharded = true});
      moments_->AddLayer(kRanges[l]);
    }
    return std::make_unique<NvmeOffload>(
        at, zero, AioConfig{}, SwapRank{.job_name = "nvme-test", .grid_size = 1}, computes, kShards,
        kRanges, memory, memory, *params_, *moments_);
  }

  static int64_t Files(const std::filesystem::path& dir) {
    int64_t n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      if (e.path().extension() == ".swp") ++n;
    }
    return n;
  }

  static Placement BothOnNvme() {
    Placement at;
    at.params = at.optimizer = Place::kNvme;
    at.host_adam = true;
    return at;
  }

  MemoryTracker tracker_;
  HostAllocator host_{&tracker_};
  ztrain::detail::ShapeOnlyAllocator shape_only_{Device::Cpu(), &tracker_};
  std::unique_ptr<kernels::Ops> ops_ = kernels::MakeCpuOps();
  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<OptimizerStateStore> moments_;
};

TEST_F(NvmeOffloadTest, OneDirectoryHoldsBothFilesHoweverItIsSpelt) {
  TempDir dir;
  const std::string path = dir.File("nvme");
  std::filesystem::create_directory(path);
  const std::unique_ptr<NvmeOffload> nvme = Make(BothOnNvme(), path, path + "/");
  EXPECT_EQ(nvme->file_bytes(),
            ParamSwapper::FileBytes(kShards, 0) + OptimizerSwapper::FileBytes(kRanges, 256));
  EXPECT_TRUE(params_->swapped());
  EXPECT_TRUE(moments_->swapped());
  EXPECT_EQ(Files(path), 2);
  const std::string said = nvme->Describe(*params_, *moments_);
  EXPECT_NE(said.find("parameter shards on NVMe"), std::string::npos) << said;
  EXPECT_NE(said.find("optimizer state on NVMe"), std::string::npos) << said;
  EXPECT_NE(said.find("I/O through"), std::string::npos) << said;
  // The swappers work: a shard stored comes back.
  std::vector<float> shard(500, 2.5f), back(500, 0.0f);
  params_->Write(1, shard.data());
  params_->Flush();
  params_->Read(1, back.data());
  EXPECT_EQ(back, shard);
}

TEST_F(NvmeOffloadTest, TwoPathsGetADirectoryEach) {
  TempDir dir;
  const std::string a = dir.File("a"), b = dir.File("b");
  std::filesystem::create_directory(a);
  std::filesystem::create_directory(b);
  const std::unique_ptr<NvmeOffload> nvme = Make(BothOnNvme(), a, b);
  EXPECT_EQ(Files(a), 1);
  EXPECT_EQ(Files(b), 1);
}

TEST_F(NvmeOffloadTest, OnlyTheOptimizerOnNvmeMakesOnlyItsFile) {
  TempDir dir;
  Placement at;
  at.params = Place::kHost;
  at.optimizer = Place::kNvme;
  at.host_adam = true;
  const std::unique_ptr<NvmeOffload> nvme = Make(at, dir.File("unused"), dir.path());
  EXPECT_FALSE(params_->swapped());
  EXPECT_TRUE(moments_->swapped());
  EXPECT_EQ(nvme->file_bytes(), OptimizerSwapper::FileBytes(kRanges, 256));
  EXPECT_EQ(Files(dir.path()), 1);
  const std::string said = nvme->Describe(*params_, *moments_);
  EXPECT_EQ(said.find("parameter shards"), std::string::npos) << said;
}

TEST_F(NvmeOffloadTest, NothingOnNvmeMakesNothing) {
  const std::unique_ptr<NvmeOffload> nvme = Make(Placement{}, "/does/not/exist", "/does/not/exist");
  EXPECT_EQ(nvme->file_bytes(), 0);
  EXPECT_FALSE(params_->swapped());
  EXPECT_FALSE(moments_->swapped());
  EXPECT_EQ(nvme->Describe(*params_, *moments_), "");
}

TEST_F(NvmeOffloadTest, AShapeOnlySetupMakesNoDirectory) {
  TempDir dir;
  const std::unique_ptr<NvmeOffload> nvme =
      Make(BothOnNvme(), dir.path(), dir.path(), /*computes=*/false);
  EXPECT_TRUE(params_->swapped());
  EXPECT_GT(nvme->file_bytes(), 0);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  EXPECT_EQ(nvme->Describe(*params_, *moments_), "");
}

}  // namespace
}  // namespace ztrain::offload
