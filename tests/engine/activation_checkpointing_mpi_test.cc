// Note [Activation checkpointing in the engine] across real ranks (at 2 and 3): with
// partition_activations each tp rank keeps its 1/tp of a checkpointed block's input, the last
// part zero-padded, and the all-gather before the recompute gives every rank the whole input
// back, bit for bit.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/memory_tracker.h"
#include "engine/activation_checkpointing.h"
#include "tests/parallel/mpi_test_env.h"

namespace ztrain {
namespace {

using comm::test::World;

TEST(ActivationCheckpointingMpiTest, EachRankKeepsItsPartAndTheGatherRestoresTheWhole) {
  comm::Communicator& tp = World();
  MemoryTracker tracker;
  HostAllocator activations(&tracker);
  const std::unique_ptr<kernels::Ops> ops = kernels::MakeCpuOps();
  ActivationCheckpointing::Options o;
  o.checkpointed = {true};
  o.partition_inputs = true;
  int waits = 0;
  ActivationCheckpointing part(o, tp, *ops, activations, nullptr, [&](comm::Work& w) {
    ++waits;
    w.Wait();
  });
  // 5 x 7 = 35 values: 18 + 17 on 2 ranks, 12 + 12 + 11 on 3 (the last part padded).
  const int64_t n = 35, chunk = (n + tp.size() - 1) / tp.size();
  auto value = [](int64_t i) { return 0.5f * static_cast<float>(i) - 3.0f; };
  Buffer owner(activations, DType::kF32, {5, 7}, MemoryCategory::kActivations);
  for (int64_t i = 0; i < n; ++i) owner.data<float>()[i] = value(i);
  const Tensor input = owner.AsTensor(DType::kF32, {5, 7});
  Buffer kept;
  part.KeepInput(input, owner, kept);
  EXPECT_EQ(owner.data(), nullptr);
  ASSERT_EQ(kept.nbytes(), static_cast<size_t>(chunk) * sizeof(float));
  for (int64_t i = 0; i < chunk; ++i) {
    const int64_t whole = tp.rank() * chunk + i;
    EXPECT_EQ(kept.data<float>()[i], whole < n ? value(whole) : 0.0f) << whole;
  }
  const Tensor back = part.RestoreInput(kept, input, owner);
  EXPECT_EQ(waits, 1);
  ASSERT_EQ(back.shape(), (Shape{5, 7}));
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(back.data<float>()[i], value(i)) << i;
}

}  // namespace
}  // namespace ztrain
