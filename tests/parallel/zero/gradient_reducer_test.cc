// Note [Gradient reducer] in one process (a data-parallel group of one, which still runs the
// collectives): when buckets launch, where each policy lands the reduced gradients, what it
// keeps and frees. tests/parallel/zero/gradient_reducer_mpi_test.cc reduces across ranks.
#include "parallel/zero/gradient_reducer.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/memory_tracker.h"

namespace ztrain::zero {
namespace {

// Layers of `sizes` elements with fp32 gradients and shards in plain vectors.
struct Model {
  explicit Model(std::vector<int64_t> sizes, ReducePolicy policy, bool accumulate = false,
                 bool overlap = true, int64_t bucket = 1 << 20, bool staged = false)
      : ops(kernels::MakeCpuOps()),
        dp(comm::MakeSelfCommunicator(
            [this](const Tensor& a, const Tensor& b) { ops->Copy(a, b); })),
        scratch(&tracker) {
    for (int64_t n : sizes) {
      ranges.push_back({n, n, 0});
      grads.emplace_back(n, 0.0f);
      shards.emplace_back(n, 0.0f);
    }
    released.assign(sizes.size(), 0);
    ReducerHooks hooks;
    hooks.gradients = [this, staged](size_t l, Buffer& staging) {
      Tensor g(grads[l].data(), DType::kF32, {ranges[l].padded});
      if (!staged) return g;
      staging = Buffer(scratch, DType::kF32, {ranges[l].padded}, MemoryCategory::kCommunication);
      const Tensor copy = staging.AsTensor(DType::kF32, {ranges[l].padded});
      ops->Copy(g, copy);
      return copy;
    };
    hooks.shard = [this](size_t l) {
      return Tensor(shards[l].data(), DType::kF32, {ranges[l].shard});
    };
    hooks.release = [this](size_t l) { ++released[l]; };
    GradientReducer::Options o;
    o.policy = policy;
    o.accumulate = accumulate;
    o.overlap = overlap;
    o.bucket_elements = bucket;
    reducer = std::make_unique<GradientReducer>(o, ranges, *dp, *ops, scratch, hooks);
  }
  void Fill(float base) {
    for (size_t l = 0; l < grads.size(); ++l) {
      for (size_t i = 0; i < grads[l].size(); ++i) grads[l][i] = base + 100.0f * l + i;
    }
  }
  void Backward() {
    for (size_t l = grads.size(); l-- > 0;) reducer->Ready(l);
  }

  std::unique_ptr<kernels::Ops> ops;
  std::unique_ptr<comm::Communicator> dp;
  MemoryTracker tracker;
  HostAllocator scratch;
  std::vector<ReduceRange> ranges;
  std::vector<std::vector<float>> grads, shards;
  std::vector<int> released;
  std::unique_ptr<GradientReducer> reducer;
};

TEST(GradientReducerTest, PolicyForEveryStage) {
  EXPECT_EQ(ReducePolicyFor(0, true), ReducePolicy::kAllReduce);
  EXPECT_EQ(ReducePolicyFor(0, false), ReducePolicy::kAllReduce);
  EXPECT_EQ(ReducePolicyFor(1, true), ReducePolicy::kScatterInto);
  EXPECT_EQ(ReducePolicyFor(2, true), ReducePolicy::kScatterAdd);
  EXPECT_EQ(ReducePolicyFor(3, true), ReducePolicy::kScatterAdd);
  EXPECT_EQ(ReducePolicyFor(3, false), ReducePolicy::kAllReduceSlice);
}

TEST(GradientReducerTest, BucketsLaunchWhenFullAndAtLayerZero) {
  // Backward order 3, 2, 1, 0 with a 64-element bucket: {3 (16), 2 (64)} fills it, {1 (32),
  // 0 (32)} goes at layer 0; a layer with no trainable elements joins nothing.
  Model m({32, 32, 64, 16, 0}, ReducePolicy::kScatterInto, false, true, 64);
  m.reducer->Ready(4);
  EXPECT_EQ(m.reducer->buckets(), 0);
  m.reducer->Ready(3);
  EXPECT_EQ(m.reducer->buckets(), 0);
  m.reducer->Ready(2);
  EXPECT_EQ(m.reducer->buckets(), 1);
  m.reducer->Ready(1);
  EXPECT_EQ(m.reducer->buckets(), 1);
  m.reducer->Ready(0);
  EXPECT_EQ(m.reducer->buckets(), 2);
  m.reducer->Finish();
}

TEST(GradientReducerTest, ScatterIntoLandsInTheShardAndFreesTheStaging) {
  Model m({32, 48}, ReducePolicy::kScatterInto, false, true, 1 << 20, /*staged=*/true);
  m.Fill(1.0f);
  m.Backward();
  EXPECT_GT(m.tracker.Current(MemoryCategory::kCommunication), 0);  // staging kept in flight
  m.reducer->Finish();
  EXPECT_EQ(m.tracker.Current(MemoryCategory::kCommunication), 0);
  EXPECT_EQ(m.shards, m.grads);
  EXPECT_EQ(m.released, (std::vector<int>{0, 0}));  // stage 1 keeps its full gradients
}

TEST(GradientReducerTest, ScatterAddAccumulatesEveryMicroBatchAndReleases) {
  Model m({32, 48}, ReducePolicy::kScatterAdd, /*accumulate=*/true);
  m.Fill(1.0f);
  m.Backward();
  m.reducer->Finish();
  m.Fill(2.0f);
  m.Backward();
  m.reducer->Finish();
  for (size_t l = 0; l < 2; ++l) {
    for (size_t i = 0; i < m.shards[l].size(); ++i) {
      EXPECT_EQ(m.shards[l][i], 3.0f + 200.0f * l + 2.0f * i);
    }
  }
  EXPECT_EQ(m.released, (std::vector<int>{2, 2}));
}

TEST(GradientReducerTest, AccumulatingKeepsOneBucketOfReceiveBuffersInFlight) {
  // Four one-layer buckets: each lands (and frees its receive buffer) before the next launches.
  Model m({64, 64, 64, 64}, ReducePolicy::kScatterAdd, true, true, 64);
  m.Fill(0.0f);
  m.Backward();
  m.reducer->Finish();
  EXPECT_EQ(m.reducer->buckets(), 4);
  EXPECT_EQ(m.tracker.Peak(MemoryCategory::kCommunication), 64 * 4);
}

TEST(GradientReducerTest, AllReduceSliceCopiesOrAddsTheRanksRange) {
  Model copy({32}, ReducePolicy::kAllReduceSlice);
  copy.Fill(5.0f);
  copy.Backward();
  copy.reducer->Finish();
  EXPECT_EQ(copy.shards, copy.grads);
  Model add({32}, ReducePolicy::kAllReduceSlice, true);
  add.shards[0].assign(32, 1.0f);
  add.Fill(5.0f);
  add.Backward();
  add.reducer->Finish();
  EXPECT_EQ(add.shards[0][7], 13.0f);
  EXPECT_EQ(add.released[0], 1);
}

TEST(GradientReducerTest, AllReduceLeavesTheShardAlone) {
  Model m({32}, ReducePolicy::kAllReduce);
  m.Fill(5.0f);
  m.Backward();
  m.reducer->Finish();
  EXPECT_EQ(m.shards[0], std::vector<float>(32, 0.0f));
  EXPECT_EQ(m.grads[0][3], 8.0f);  // reduced in place (one rank: itself)
}

// (kAllReduceSlice lands in Finish's copy, so a shard filled before Finish was landed at once.)
TEST(GradientReducerTest, WithoutOverlapEachBucketLandsAtOnce) {
  Model m({32, 32}, ReducePolicy::kAllReduceSlice, false, /*overlap=*/false, 32);
  m.Fill(1.0f);
  m.reducer->Ready(1);
  EXPECT_EQ(m.shards[1], m.grads[1]);  // no Finish yet
  EXPECT_EQ(m.shards[0], std::vector<float>(32, 0.0f));
  m.reducer->Ready(0);
  EXPECT_EQ(m.shards[0], m.grads[0]);
  Model overlapped({32, 32}, ReducePolicy::kAllReduceSlice, false, true, 32);
  overlapped.Fill(1.0f);
  overlapped.reducer->Ready(1);
  EXPECT_EQ(overlapped.shards[1], std::vector<float>(32, 0.0f));  // waits for Finish
  overlapped.reducer->Ready(0);
  overlapped.reducer->Finish();
  EXPECT_EQ(overlapped.shards[1], overlapped.grads[1]);
}

}  // namespace
}  // namespace ztrain::zero
