// Note [Gradient reducer] across real ranks (comm_mpi_test, at 2 and 4): every policy lands
// the sum over ranks of each layer's gradients where the rank expects it, bucket by bucket,
// with 16-bit-style staging copies and with accumulation over micro-batches.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/allocator.h"
#include "parallel/zero/gradient_reducer.h"
#include "tests/parallel/mpi_test_env.h"

namespace ztrain::zero {
namespace {

using comm::test::World;

// Gradient element i of layer l on rank r: (r + 1) (100 l + i), exact in fp32 here; the
// sum over ranks is (1 + ... + size) (100 l + i).
float Grad(int rank, size_t l, int64_t i) { return (rank + 1.0f) * (100.0f * l + i); }
float Sum(size_t l, int64_t i) {
  const int n = World().size();
  return n * (n + 1) / 2.0f * (100.0f * l + i);
}

void Check(ReducePolicy policy, bool accumulate, bool staged, int micro_batches) {
  comm::Communicator& dp = World();
  const auto ops = kernels::MakeCpuOps();
  HostAllocator scratch(nullptr);
  std::vector<ReduceRange> ranges;
  std::vector<std::vector<float>> grads, shards;
  for (int64_t per_rank : {16, 48, 32}) {
    const int64_t padded = per_rank * dp.size();
    ranges.push_back({padded, per_rank, dp.rank() * per_rank});
    grads.emplace_back(padded);
    shards.emplace_back(per_rank, 0.0f);
  }
  ReducerHooks hooks;
  hooks.gradients = [&](size_t l, Buffer& staging) {
    Tensor g(grads[l].data(), DType::kF32, {ranges[l].padded});
    if (!staged) return g;
    staging = Buffer(scratch, DType::kF32, {ranges[l].padded}, MemoryCategory::kCommunication);
    ops->Copy(g, staging.AsTensor(DType::kF32, {ranges[l].padded}));
    return staging.AsTensor(DType::kF32, {ranges[l].padded});
  };
  hooks.shard = [&](size_t l) { return Tensor(shards[l].data(), DType::kF32, {ranges[l].shard}); };
  hooks.release = [](size_t) {};
  GradientReducer::Options o;
  o.policy = policy;
  o.accumulate = accumulate;
  o.bucket_elements = 48 * dp.size();  // layers 2 and 1 in one bucket, layer 0 in the next
  GradientReducer reducer(o, ranges, dp, *ops, scratch, hooks);
  for (int mb = 0; mb < micro_batches; ++mb) {
    for (size_t l = 0; l < grads.size(); ++l) {
      for (int64_t i = 0; i < ranges[l].padded; ++i) grads[l][i] = Grad(dp.rank(), l, i);
    }
    for (size_t l = grads.size(); l-- > 0;) reducer.Ready(l);
    reducer.Finish();
  }
  EXPECT_EQ(reducer.buckets(), 2 * micro_batches);
  for (size_t l = 0; l < grads.size(); ++l) {
    for (int64_t i = 0; i < ranges[l].shard; ++i) {
      const int64_t at = ranges[l].opt_begin + i;
      if (policy == ReducePolicy::kAllReduce) {
        ASSERT_EQ(grads[l][at], Sum(l, at)) << "layer " << l << " element " << at;
      } else {
        ASSERT_EQ(shards[l][i], micro_batches * Sum(l, at)) << "layer " << l << " element " << at;
      }
    }
  }
}

TEST(GradientReducerMpiTest, AllReduceSumsTheWholeLayer) {
  Check(ReducePolicy::kAllReduce, false, false, 1);
}
TEST(GradientReducerMpiTest, ScatterIntoGivesEachRankItsShard) {
  Check(ReducePolicy::kScatterInto, false, false, 1);
  Check(ReducePolicy::kScatterInto, false, /*staged=*/true, 1);
}
TEST(GradientReducerMpiTest, ScatterAddAccumulatesMicroBatches) {
  Check(ReducePolicy::kScatterAdd, true, false, 3);
  Check(ReducePolicy::kScatterAdd, true, true, 2);
}
TEST(GradientReducerMpiTest, AllReduceSliceCopiesOrAdds) {
  Check(ReducePolicy::kAllReduceSlice, false, true, 1);
  Check(ReducePolicy::kAllReduceSlice, true, false, 2);
}

}  // namespace
}  // namespace ztrain::zero
