// The optimizer-state store (Note [Optimizer state store]) on the CPU ops, with a real swap
// file for NVMe: m and v walked per layer and all together keep, in every place, exactly what
// in-memory arrays would; ranges come in the global order; a walk that does not save leaves
// NVMe tiles as they were; the buffers the device step uses are the walked ones.
#include "offload/optimizer_state_store.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/allocator.h"
#include "core/buffer.h"
#include "core/memory_tracker.h"
#include "io_test_util.h"
#include "kernels/ops.h"
#include "offload/io/io_engine.h"
#include "offload/optimizer_swapper.h"

namespace ztrain::offload {
namespace {

using test_util::TempDir;

const std::vector<int64_t> kLayers = {700, 0, 2500, 60};  // a layer with no optimizer range

class OptimizerStateStoreTest : public ::testing::TestWithParam<Place> {
 protected:
  void SetUp() override {
    store_ = std::make_unique<OptimizerStateStore>(
        GetParam(), *ops_, [this](Place where, int64_t n, MemoryCategory c, DType d) {
          ++buffers_;
          Buffer b(where == Place::kPinned ? static_cast<Allocator&>(pinned_) : host_, d, {n}, c);
          b.Zero();
          return b;
        });
    for (int64_t n : kLayers) store_->AddLayer(n);
    if (GetParam() == Place::kNvme) {
      io_ = IoEngine::Make(IoOptions{});
      store_->SwapTo(std::make_unique<OptimizerSwapper>(
          io_.get(), dir_.File("opt.swp"), kLayers,
          OptimizerSwapOptions{.tile_elements = 1000, .buffers = 3}, host_));
    }
  }

  MemoryTracker tracker_;
  HostAllocator host_{&tracker_};
  PinnedHostAllocator pinned_{&tracker_};
  std::unique_ptr<kernels::Ops> ops_ = kernels::MakeCpuOps();
  TempDir dir_;
  std::unique_ptr<IoEngine> io_;
  int buffers_ = 0;
  std::unique_ptr<OptimizerStateStore> store_;
};

TEST_P(OptimizerStateStoreTest, WalksKeepWhatAnArrayWould) {
  int64_t total = 0;
  for (int64_t n : kLayers) total += n;
  std::vector<float> m(static_cast<size_t>(total), 0.0f), v(m.size(), 0.0f);
  float stamp = 0.0f;
  // Checks the walked ranges against the arrays and (when saving) writes new values.
  auto step = [&](bool save) {
    return [&, save](int64_t begin, int64_t count, float* tm, float* tv) {
      stamp += 1.0f;
      for (int64_t i = 0; i < count; ++i) {
        const size_t at = static_cast<size_t>(begin + i);
        ASSERT_EQ(tm[i], m[at]) << "m[" << at << "]";
        ASSERT_EQ(tv[i], v[at]) << "v[" << at << "]";
        tm[i] = stamp + static_cast<float>(i);
        tv[i] = -stamp;
        if (save) {
          m[at] = tm[i];
          v[at] = tv[i];
        }
      }
    };
  };
  store_->Walk(std::nullopt, step(true), /*save=*/true);
  for (size_t l : {size_t{2}, size_t{0}, size_t{3}, size_t{1}}) {
    store_->Prefetch(l);
    store_->Walk(l, step(true), /*save=*/true);
  }
  if (GetParam() == Place::kNvme) {
    // A walk that does not save must leave the file as it was.
    store_->Walk(2, step(false), /*save=*/false);
  }
  int64_t seen = 0;
  store_->Walk(
      std::nullopt,
      [&](int64_t begin, int64_t count, float* tm, float* tv) {
        ASSERT_EQ(begin, seen);  // ranges in the global order, covering every layer's state
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(tm[i], m[static_cast<size_t>(begin + i)]) << begin + i;
          ASSERT_EQ(tv[i], v[static_cast<size_t>(begin + i)]) << begin + i;
        }
        seen += count;
      },
      /*save=*/false);
  EXPECT_EQ(seen, total);
}

TEST_P(OptimizerStateStoreTest, TheDeviceStepSeesTheWalkedBuffers) {
  if (GetParam() == Place::kNvme) {
    EXPECT_TRUE(store_->swapped());
    EXPECT_EQ(buffers_, 0);  // the swapper holds m and v
    return;
  }
  EXPECT_EQ(buffers_, 2 * static_cast<int>(kLayers.size()));
  store_->Walk(
      2,
      [&](int64_t begin, int64_t count, float* tm, float* tv) {
        EXPECT_EQ(begin, 700);  // after layers 0 and 1
        for (int64_t i = 0; i < count; ++i) {
          tm[i] = static_cast<float>(i);
          tv[i] = static_cast<float>(2 * i);
        }
      },
      /*save=*/true);
  const auto [m, v] = store_->DeviceState(2);
  ASSERT_EQ(m.numel(), 2500);
  EXPECT_EQ(m.data<float>()[1234], 1234.0f);
  EXPECT_EQ(v.data<float>()[2499], 4998.0f);
}

INSTANTIATE_TEST_SUITE_P(Places, OptimizerStateStoreTest,
                         ::testing::Values(Place::kDevice, Place::kHost, Place::kPinned,
                                           Place::kNvme),
                         [](const ::testing::TestParamInfo<Place>& info) {
                           return std::string(info.param == Place::kDevice   ? "device"
                                              : info.param == Place::kHost   ? "host"
                                              : info.param == Place::kPinned ? "pinned"
                                                                             : "nvme");
                         });

}  // namespace
}  // namespace ztrain::offload
