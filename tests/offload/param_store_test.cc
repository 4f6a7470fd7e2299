// The parameter store (Note [Parameter store]) on the CPU ops, with a real swap file for
// NVMe: every place a layer's held parameters can live gives back what was written — through
// Read/Write, the host view and its commit, the optimizer's master and the gather's source
// in fp32 and bf16 — and keeps the fp32 master and the compute copy in step.
#include "offload/param_store.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/buffer.h"
#include "core/dtype.h"
#include "core/memory_tracker.h"
#include "io_test_util.h"
#include "kernels/ops.h"
#include "offload/io/io_engine.h"
#include "offload/param_swapper.h"

namespace ztrain::offload {
namespace {

using test_util::TempDir;

// Two layers: the first 48 elements whole or a 16-element shard of them at offset 16 (rank 1
// of 3), its optimizer range the shard (or, unsharded, elements 16..31); the second 96 or 32.
std::vector<HeldShape> Shapes(bool sharded) {
  return {{.padded = 48, .shard = 16, .opt_begin = 16, .opt_len = 16, .sharded = sharded},
          {.padded = 96, .shard = 32, .opt_begin = 32, .opt_len = 32, .sharded = sharded}};
}

struct Layout {
  Place params = Place::kHost;
  bool sharded = false;
  bool on_device = false;  // the master beside the parameters (AdamW on the host)
  DType compute = DType::kF32;
};

std::string Name(const ::testing::TestParamInfo<Layout>& info) {
  const Layout& s = info.param;
  std::string name = s.params == Place::kDevice   ? "device"
                     : s.params == Place::kHost   ? "host"
                     : s.params == Place::kPinned ? "pinned"
                                                  : "nvme";
  if (s.sharded) name += "_sharded";
  if (s.on_device) name += "_master";
  if (s.compute == DType::kBF16) name += "_bf16";
  return name;
}

class ParamStoreTest : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    const Layout& s = GetParam();
    Placement at;
    at.params = s.params;
    at.optimizer = Place::kHost;
    at.host_adam = s.on_device;
    at.host_master = s.on_device && s.params == Place::kDevice;
    store_ = std::make_unique<ParamStore>(
        ParamStore::Options{
            .placement = at, .on_device = s.on_device, .compute = s.compute, .computes = true},
        *ops_, host_, host_, [this](Place where, int64_t n, MemoryCategory c, DType d) {
          places_.push_back(where);
          Buffer b(where == Place::kPinned ? static_cast<Allocator&>(pinned_) : host_, d, {n}, c);
          b.Zero();
          return b;
        });
    std::vector<int64_t> shards;
    for (const HeldShape& shape : Shapes(s.sharded)) {
      store_->AddLayer(shape);
      shards.push_back(shape.shard);
    }
    if (s.params == Place::kNvme) {
      io_ = IoEngine::Make(IoOptions{});
      // The first layer stays in memory, the second goes to the file.
      store_->SwapTo(std::make_unique<ParamSwapper>(
          io_.get(), dir_.File("params.swp"), shards,
          ParamSwapOptions{.buffer_count = 2, .buffer_elements = 64, .max_in_cpu = 16}, host_,
          host_));
    }
  }

  // Distinct values for layer l's held elements, `salt` apart from one call to the next.
  std::vector<float> Values(size_t l, float salt) const {
    std::vector<float> v(static_cast<size_t>(store_->shape(l).held()));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = salt + 0.25f * static_cast<float>(i) + static_cast<float>(l);
    return v;
  }

  std::vector<float> ReadBack(size_t l) {
    std::vector<float> got(static_cast<size_t>(store_->shape(l).held()), -1.0f);
    store_->Read(l, got.data());
    return got;
  }

  MemoryTracker tracker_;
  HostAllocator host_{&tracker_};
  PinnedHostAllocator pinned_{&tracker_};
  std::unique_ptr<kernels::Ops> ops_ = kernels::MakeCpuOps();
  TempDir dir_;
  std::unique_ptr<IoEngine> io_;
  std::vector<Place> places_;
  std::unique_ptr<ParamStore> store_;
};

TEST_P(ParamStoreTest, WhatIsWrittenIsReadBack) {
  for (size_t l = 0; l < store_->layers(); ++l) store_->Write(l, Values(l, 1.0f).data());
  store_->Flush();
  for (size_t l = 0; l < store_->layers(); ++l) EXPECT_EQ(ReadBack(l), Values(l, 1.0f)) << l;
  EXPECT_EQ(store_->swapped(), GetParam().params == Place::kNvme);
  EXPECT_EQ(store_->held(0).data() == nullptr, GetParam().params == Place::kNvme);
}

TEST_P(ParamStoreTest, TheHostViewIsCommittedWhereTheParametersLive) {
  for (size_t l = 0; l < store_->layers(); ++l) store_->Write(l, Values(l, 1.0f).data());
  for (size_t l = 0; l < store_->layers(); ++l) {
    Buffer staged;
    float* held = store_->OpenOnHost(l, staged, MemoryCategory::kWorkspace, /*current=*/true);
    const std::vector<float> before = Values(l, 1.0f);
    ASSERT_EQ(std::vector<float>(held, held + before.size()), before);
    // In place exactly when the parameters are host memory.
    EXPECT_EQ(staged.data() == nullptr, GetParam().params != Place::kNvme);
    held[3] = 1000.0f;
    store_->Commit(l, staged);
    Buffer zeroed;
    float* fresh = store_->OpenOnHost(l, zeroed, MemoryCategory::kWorkspace, /*current=*/false);
    if (zeroed.data() != nullptr) {
      EXPECT_EQ(fresh[3], 0.0f);  // a staged copy starts at zero
    }
  }
  store_->Flush();
  for (size_t l = 0; l < store_->layers(); ++l) {
    std::vector<float> want = Values(l, 1.0f);
    want[3] = 1000.0f;
    EXPECT_EQ(ReadBack(l), want) << l;
  }
}

TEST_P(ParamStoreTest, TheMasterUpdatedInPlaceReachesTheParameters) {
  for (size_t l = 0; l < store_->layers(); ++l) store_->Write(l, Values(l, 2.0f).data());
  for (size_t l = 0; l < store_->layers(); ++l) {
    const HeldShape& shape = store_->shape(l);
    store_->Prefetch(l);
    float* master = store_->Acquire(l);
    const std::vector<float> held = Values(l, 2.0f);
    for (int64_t i = 0; i < shape.opt_len; ++i) {
      ASSERT_EQ(master[i], held[shape.opt_in_held() + i]) << "layer " << l << " element " << i;
      master[i] = -master[i];
    }
    store_->Release(l, /*changed=*/true);
  }
  store_->Flush();
  for (size_t l = 0; l < store_->layers(); ++l) {
    const HeldShape& shape = store_->shape(l);
    std::vector<float> want = Values(l, 2.0f);
    for (int64_t i = 0; i < shape.opt_len; ++i) want[shape.opt_in_held() + i] *= -1.0f;
    EXPECT_EQ(ReadBack(l), want) << l;
    if (store_->held(l).data() != nullptr) {  // the optimizer's device view sees the update
      const Tensor range = store_->OptimizerRange(l);
      EXPECT_EQ(range.data<float>()[0], want[shape.opt_in_held()]);
    }
  }
}

TEST_P(ParamStoreTest, TheGatherSendsTheShardInTheGathersDtype) {
  if (!GetParam().sharded) GTEST_SKIP() << "only stage 3 gathers";
  const DType dtype = GetParam().compute;
  for (size_t l = 0; l < store_->layers(); ++l) store_->Write(l, Values(l, 3.0f).data());
  store_->RefreshComputeCopies();
  for (size_t l = 0; l < store_->layers(); ++l) {
    const HeldShape& shape = store_->shape(l);
    Buffer chunk(host_, dtype, {shape.shard}, MemoryCategory::kWorkspace);
    chunk.Zero();
    const Tensor mine = chunk.AsTensor(dtype, {shape.shard});
    Buffer staged;
    const Tensor source = store_->GatherSource(l, mine, staged);
    ASSERT_EQ(source.dtype(), dtype);
    ASSERT_EQ(source.numel(), shape.shard);
    const std::vector<float> want = Values(l, 3.0f);
    for (int64_t i = 0; i < shape.shard; ++i) {
      const float got = dtype == DType::kF32
                            ? source.data<float>()[i]
                            : Bf16ToFloat(static_cast<const uint16_t*>(source.data())[i]);
      const float expected = dtype == DType::kF32 ? want[i] : Bf16ToFloat(FloatToBf16(want[i]));
      ASSERT_EQ(got, expected) << "layer " << l << " element " << i;
    }
    // Held fp32 in memory is sent as it is; anything else arrives in the rank's chunk.
    const bool as_held = GetParam().params != Place::kNvme && dtype == DType::kF32;
    EXPECT_EQ(source.data() == mine.data(), !as_held) << l;
  }
}

TEST_P(ParamStoreTest, TheComputeCopyFollowsTheFp32Values) {
  const Layout& s = GetParam();
  if (s.compute == DType::kF32 || s.sharded) GTEST_SKIP() << "a compute copy of the whole layer";
  for (size_t l = 0; l < store_->layers(); ++l) {
    store_->Write(l, Values(l, 4.0f).data());
    store_->RefreshComputeCopies();
    const Buffer& lp = store_->compute_copy(l);
    ASSERT_NE(lp.data(), nullptr);
    const std::vector<float> want = Values(l, 4.0f);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(lp.data<uint16_t>()[i], FloatToBf16(want[i])) << i;
    }
  }
}

TEST_P(ParamStoreTest, BuffersArePlacedAsThePlacementSays) {
  const Layout& s = GetParam();
  // Per layer: the fp32 held elements unless on NVMe, a compute copy where mixed precision
  // needs one, the pinned master beside device parameters.
  std::vector<Place> want;
  for (size_t l = 0; l < store_->layers(); ++l) {
    if (s.params != Place::kNvme) want.push_back(s.params);
    if (s.compute != DType::kF32 && !s.sharded) want.push_back(Place::kDevice);
    if (s.compute != DType::kF32 && s.sharded && s.on_device &&
        (s.params == Place::kHost || s.params == Place::kPinned)) {
      want.push_back(s.params);
    }
    if (s.on_device && s.params == Place::kDevice) want.push_back(Place::kPinned);
  }
  EXPECT_EQ(places_, want);
}

INSTANTIATE_TEST_SUITE_P(
    Places, ParamStoreTest,
    ::testing::Values(
        Layout{.params = Place::kDevice}, Layout{.params = Place::kDevice, .compute = DType::kBF16},
        Layout{.params = Place::kDevice, .sharded = true},
        Layout{.params = Place::kDevice, .sharded = true, .compute = DType::kBF16},
        Layout{.params = Place::kDevice, .sharded = true, .on_device = true},
        Layout{.params = Place::kDevice, .on_device = true},
        Layout{.params = Place::kHost, .sharded = true},
        Layout{
            .params = Place::kPinned, .sharded = true, .on_device = true, .compute = DType::kBF16},
        Layout{.params = Place::kNvme, .sharded = true},
        Layout{.params = Place::kNvme, .sharded = true, .compute = DType::kBF16}),
    Name);

}  // namespace
}  // namespace ztrain::offload
