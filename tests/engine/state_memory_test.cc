// Note [The engine's memory] on its own: on the CPU backend every kind of state is counted in
// the device's figures (host memory is the device's), the pinned part also in the pinned
// tracker; the totals add up by category; state buffers come zeroed; staging copies go
// through the caching allocator; and a shape-only set counts the same bytes holding none.
#include "engine/state_memory.h"

#include <gtest/gtest.h>

#include <memory>

#include "estimate/shape_only.h"

namespace ztrain {
namespace {

using offload::Place;

TEST(StateMemoryTest, OnTheCpuEveryKindOfStateIsTheDevicesAndPinnedIsCountedApart) {
  const std::unique_ptr<kernels::Ops> ops = kernels::MakeCpuOps();
  StateMemory memory(Device::Cpu(), /*computes=*/true, *ops);
  EXPECT_EQ(memory.device_pinned(), nullptr);
  {
    Buffer device = memory.State(Place::kDevice, 100, MemoryCategory::kParameters);
    Buffer host = memory.State(Place::kHost, 50, MemoryCategory::kOptimizerState);
    Buffer pinned = memory.State(Place::kPinned, 30, MemoryCategory::kOptimizerState, DType::kBF16);
    EXPECT_EQ(memory.device().Current(MemoryCategory::kParameters), 400);
    EXPECT_EQ(memory.device().Current(MemoryCategory::kOptimizerState), 200 + 60);
    EXPECT_EQ(memory.host().TotalCurrent(), 0);
    EXPECT_EQ(memory.pinned().TotalCurrent(), 60);
    EXPECT_EQ(memory.all().TotalCurrent(), 400 + 200 + 60);
    for (const Buffer* b : {&device, &host}) {
      for (int64_t i = 0; i < static_cast<int64_t>(b->nbytes() / 4); ++i) {
        EXPECT_EQ(b->data<float>()[i], 0.0f);
      }
    }
    device.data<float>()[7] = 3.0f;
    memory.Zero(device);
    EXPECT_EQ(device.data<float>()[7], 0.0f);
    // Staging copies come from the caching allocator, counted as the device's.
    Buffer staged(memory.staging(), DType::kF32, {10}, MemoryCategory::kWorkspace);
    EXPECT_EQ(&memory.staging(), static_cast<Allocator*>(&memory.activations()));
    EXPECT_EQ(memory.device().Current(MemoryCategory::kWorkspace), 40);
  }
  EXPECT_EQ(memory.all().TotalCurrent(), 0);
  EXPECT_EQ(memory.all().TotalPeak(), 400 + 200 + 60 + 40);
}

TEST(StateMemoryTest, AShapeOnlySetCountsTheSameBytesAndHoldsNone) {
  detail::ShapeOps ops(Device::Cpu());
  StateMemory memory(Device::Cpu(), /*computes=*/false, ops);
  Buffer device = memory.State(Place::kDevice, 1 << 20, MemoryCategory::kParameters);
  Buffer pinned = memory.State(Place::kPinned, 1 << 10, MemoryCategory::kOptimizerState);
  EXPECT_FALSE(memory.host_memory().holds_data());
  EXPECT_EQ(memory.device().Current(MemoryCategory::kParameters), 4 << 20);
  EXPECT_EQ(memory.pinned().TotalCurrent(), 4 << 10);
  EXPECT_EQ(memory.unpinned_bytes(), 0);
}

}  // namespace
}  // namespace ztrain
