// Note [Parameter gatherer] across real ranks (comm_mpi_test, at 2 and 4): each layer's
// shards all-gathered into its whole buffer before the layer runs, through the communicator,
// under a plan that prefetches and one that does not; and stages 1-2's gather of the updated
// shards after the step (GatherUpdatedShards), with one bucket and with one layer a bucket.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/allocator.h"
#include "kernels/ops.h"
#include "parallel/zero/param_gatherer.h"
#include "tests/parallel/mpi_test_env.h"

namespace ztrain::zero {
namespace {

using comm::test::World;

// Element i of layer l's whole buffer: 1000 l + i, so rank r's shard holds its chunk of it.
float Value(size_t l, int64_t i) { return 1000.0f * l + i; }

void Check(const GatherLimits& limits) {
  comm::Communicator& dp = World();
  HostAllocator memory(nullptr);
  const std::vector<int64_t> per_rank = {16, 48, 32};
  std::vector<std::vector<float>> shards;
  std::vector<GatherUnit> units;
  for (size_t l = 0; l < per_rank.size(); ++l) {
    shards.emplace_back(per_rank[l]);
    for (int64_t i = 0; i < per_rank[l]; ++i) {
      shards[l][i] = Value(l, dp.rank() * per_rank[l] + i);
    }
    // Layer 2 binds layer 0 too (a tied weight).
    units.push_back({per_rank[l] * dp.size(), 0, l == 2 ? UnitUse{2, 0} : UnitUse{l}});
  }
  GatherHooks hooks;
  hooks.gather = [&](size_t u, const Buffer& whole) {
    return dp.AllGather(Tensor(shards[u].data(), DType::kF32, {per_rank[u]}),
                        whole.AsTensor(DType::kF32, {units[u].elements}));
  };
  hooks.gather_frozen = [](size_t, const Buffer&) -> comm::WorkPtr { return nullptr; };
  ParamGatherer::Options o;
  o.limits = limits;
  ParamGatherer gatherer(o, units, memory, hooks);
  gatherer.Start(2, /*backward=*/true);
  for (int phase = 0; phase < 4; ++phase) {
    for (size_t k = 0; k < units.size(); ++k) {
      const size_t l = phase % 2 == 1 ? units.size() - 1 - k : k;
      gatherer.BeforeLayer(l);
      for (size_t u : units[l].needs) {
        const float* whole = gatherer.Whole(u).data<float>();
        ASSERT_NE(whole, nullptr);
        for (int64_t i = 0; i < units[u].elements; ++i) {
          ASSERT_EQ(whole[i], Value(u, i)) << "unit " << u << " element " << i;
        }
      }
      gatherer.AfterLayer();
    }
  }
  EXPECT_EQ(gatherer.plan(), nullptr);
}

TEST(ParamGathererMpiTest, GathersEveryShardBeforeTheLayerRuns) {
  Check({.prefetch_bucket = 0, .max_live = 0, .max_reuse_distance = 0, .persistence_threshold = 0});
}

TEST(ParamGathererMpiTest, PrefetchedGathersLandToo) {
  Check({});  // everything gathered at the first position, in flight together
}

TEST(ParamGathererMpiTest, UpdatedShardsAreGatheredIntoEveryRanksWholeLayers) {
  comm::Communicator& dp = World();
  HostAllocator memory(nullptr);
  const std::unique_ptr<kernels::Ops> ops = kernels::MakeCpuOps();
  const std::vector<int64_t> per_rank = {16, 0, 48};  // the middle layer has no parameters
  for (const int64_t bucket : {int64_t{1}, int64_t{1} << 20}) {
    std::vector<std::vector<float>> layers;
    std::vector<Tensor> wholes;
    for (size_t l = 0; l < per_rank.size(); ++l) {
      // This rank's shard holds the updated values; the rest is stale.
      const int64_t n = per_rank[l] * dp.size();
      std::vector<float>& whole = layers.emplace_back(static_cast<size_t>(n), -1.0f);
      for (int64_t i = 0; i < per_rank[l]; ++i) {
        whole[dp.rank() * per_rank[l] + i] = Value(l, dp.rank() * per_rank[l] + i);
      }
    }
    for (auto& whole : layers) {
      wholes.emplace_back(whole.data(), DType::kF32, Shape{static_cast<int64_t>(whole.size())});
    }
    int waits = 0;
    GatherUpdatedShards(wholes, dp, *ops, memory, bucket, [&](comm::Work& w) {
      ++waits;
      w.Wait();
    });
    EXPECT_EQ(waits, 2) << "one wait per layer with parameters";
    for (size_t l = 0; l < layers.size(); ++l) {
      for (size_t i = 0; i < layers[l].size(); ++i) {
        EXPECT_EQ(layers[l][i], Value(l, static_cast<int64_t>(i))) << l << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace ztrain::zero
