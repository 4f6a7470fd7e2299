// ZeRO stage 3 gather plans: every position finds its units gathered, nothing is gathered
// twice or released while absent, the live elements stay within the limits, and the limits
// change the plan the way DeepSpeed's keys say.
#include "parallel/zero/gather_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/error.h"

namespace ztrain::zero {
namespace {

// The positions of `micro_batches` forward+backward passes over `n` layers, each layer
// needing its own unit, and the last layer also unit 0 (the tied embedding).
std::vector<UnitUse> GptUses(size_t n, int micro_batches) {
  std::vector<UnitUse> uses;
  auto use = [n](size_t l) { return l + 1 == n && l > 0 ? UnitUse{l, 0} : UnitUse{l}; };
  for (int m = 0; m < micro_batches; ++m) {
    for (size_t l = 0; l < n; ++l) uses.push_back(use(l));
    for (size_t l = n; l-- > 0;) uses.push_back(use(l));
  }
  return uses;
}

struct Replay {
  int64_t peak = 0;
  int64_t fetched = 0;  // elements gathered over the whole plan
};

// Replays a plan, failing the test when it breaks an invariant.
Replay Check(const std::vector<int64_t>& sizes, const std::vector<UnitUse>& uses,
             const GatherPlan& plan) {
  Replay r;
  std::vector<bool> live(sizes.size(), false);
  int64_t total = 0;
  EXPECT_EQ(plan.actions.size(), uses.size());
  for (size_t p = 0; p < uses.size(); ++p) {
    for (size_t u : plan.actions[p].fetch) {
      EXPECT_FALSE(live[u]) << "unit " << u << " gathered twice at position " << p;
      live[u] = true;
      total += sizes[u];
      r.fetched += sizes[u];
    }
    for (size_t u : uses[p]) EXPECT_TRUE(live[u]) << "unit " << u << " absent at position " << p;
    r.peak = std::max(r.peak, total);
    for (size_t u : plan.actions[p].release) {
      EXPECT_TRUE(live[u]) << "unit " << u << " released while absent at position " << p;
      live[u] = false;
      total -= sizes[u];
    }
  }
  EXPECT_EQ(total, 0) << "units still gathered after the last position";
  EXPECT_EQ(r.peak, plan.peak_live);
  return r;
}

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

TEST(GatherPlanTest, TightLimitsGatherEachUseAndReleaseRightAfter) {
  const std::vector<int64_t> sizes = {100, 40, 40, 40, 10};
  const auto uses = GptUses(sizes.size(), 2);
  const GatherLimits tight{.prefetch_bucket = 0, .max_live = 0, .max_reuse_distance = 0,
                           .persistence_threshold = 0};
  const GatherPlan plan = PlanGathers(sizes, uses, tight);
  const Replay r = Check(sizes, uses, plan);
  for (size_t p = 0; p < uses.size(); ++p) {
    EXPECT_EQ(plan.actions[p].fetch, uses[p]) << "position " << p;
    EXPECT_EQ(plan.actions[p].release.size(), uses[p].size()) << "position " << p;
  }
  // Forward and backward each gather every unit once, per micro-batch (plus the tied unit 0
  // a second time for the last layer): the 2Ψ of the 3Ψ stage 3 volume.
  EXPECT_EQ(r.fetched, 2 * 2 * (Sum(sizes) + sizes[0]));
  EXPECT_EQ(r.peak, sizes[0] + sizes[4]);  // the last layer and its tied embedding
}

TEST(GatherPlanTest, UnlimitedPrefetchGathersEverythingUpFrontOnce) {
  const std::vector<int64_t> sizes = {100, 40, 40, 40, 10};
  const auto uses = GptUses(sizes.size(), 3);
  const GatherLimits unlimited{.prefetch_bucket = 1 << 30, .max_live = 1 << 30,
                               .max_reuse_distance = 1 << 30, .persistence_threshold = 0};
  const GatherPlan plan = PlanGathers(sizes, uses, unlimited);
  const Replay r = Check(sizes, uses, plan);
  EXPECT_EQ(plan.actions[0].fetch, (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(r.fetched, Sum(sizes));
  EXPECT_EQ(r.peak, Sum(sizes));
}

TEST(GatherPlanTest, PrefetchStaysWithinTheBucketAndKeepsOrder) {
  const std::vector<int64_t> sizes = {100, 40, 40, 40, 10};
  const auto uses = GptUses(sizes.size(), 1);
  // Room for one block ahead, not two.
  const GatherLimits limits{.prefetch_bucket = 45, .max_live = 1 << 30, .max_reuse_distance = 0,
                            .persistence_threshold = 0};
  const GatherPlan plan = PlanGathers(sizes, uses, limits);
  Check(sizes, uses, plan);
  EXPECT_EQ(plan.actions[0].fetch, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(plan.actions[1].fetch, (std::vector<size_t>{2}));
  EXPECT_EQ(plan.actions[2].fetch, (std::vector<size_t>{3}));
}

TEST(GatherPlanTest, ReuseDistanceDecidesWhetherAUnitIsKept) {
  const std::vector<int64_t> sizes = {10, 30};
  const std::vector<UnitUse> uses = {{0}, {1}, {0}};
  GatherLimits limits{.prefetch_bucket = 0, .max_live = 1 << 30, .max_reuse_distance = 30,
                      .persistence_threshold = 0};
  Replay kept = Check(sizes, uses, PlanGathers(sizes, uses, limits));
  EXPECT_EQ(kept.fetched, 40);
  limits.max_reuse_distance = 29;
  Replay dropped = Check(sizes, uses, PlanGathers(sizes, uses, limits));
  EXPECT_EQ(dropped.fetched, 50);
  // Keeping must also fit max_live.
  limits.max_reuse_distance = 30;
  limits.max_live = 5;
  EXPECT_EQ(Check(sizes, uses, PlanGathers(sizes, uses, limits)).fetched, 50);
}

TEST(GatherPlanTest, PersistentUnitsAreGatheredOncePerStep) {
  const std::vector<int64_t> sizes = {100, 40, 40, 40, 10};
  const auto uses = GptUses(sizes.size(), 2);
  const GatherLimits limits{.prefetch_bucket = 0, .max_live = 0, .max_reuse_distance = 0,
                            .persistence_threshold = 50};
  const GatherPlan plan = PlanGathers(sizes, uses, limits);
  const Replay r = Check(sizes, uses, plan);
  // Units 1..4 are persistent: gathered once; unit 0 every time it is used (4 times per
  // micro-batch: embedding and LM head, forward and backward).
  EXPECT_EQ(r.fetched, 130 + 2 * 4 * 100);
  EXPECT_EQ(plan.actions.back().release.size(), 5u);  // everything goes at the end
}

// Random sizes, uses and limits: the invariants hold and the peak stays within
// max_live + the largest position + the persistent units.
TEST(GatherPlanTest, RandomPlansKeepTheInvariantsAndTheBound) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = 1 + rng() % 9;
    std::vector<int64_t> sizes(n);
    for (auto& s : sizes) s = 1 + rng() % 100;
    std::vector<UnitUse> uses = GptUses(n, 1 + static_cast<int>(rng() % 3));
    const GatherLimits limits{.prefetch_bucket = static_cast<int64_t>(rng() % 200),
                              .max_live = static_cast<int64_t>(rng() % 300),
                              .max_reuse_distance = static_cast<int64_t>(rng() % 300),
                              .persistence_threshold = static_cast<int64_t>(rng() % 30)};
    const GatherPlan plan = PlanGathers(sizes, uses, limits);
    const Replay r = Check(sizes, uses, plan);
    int64_t largest_use = 0, persistent = 0;
    for (const UnitUse& use : uses) {
      int64_t s = 0;
      for (size_t u : use) s += sizes[u];
      largest_use = std::max(largest_use, s);
    }
    for (int64_t s : sizes) persistent += s < limits.persistence_threshold ? s : 0;
    ASSERT_LE(r.peak, limits.max_live + largest_use + persistent) << "trial " << trial;
    if (HasFailure()) FAIL() << "trial " << trial;
  }
}

TEST(GatherPlanTest, UnknownOrRepeatedUnitIsAnError) {
  const std::vector<int64_t> sizes = {1};
  const std::vector<UnitUse> unknown = {{1}}, repeated = {{0, 0}};
  EXPECT_THROW(PlanGathers(sizes, unknown, GatherLimits{}), Error);
  EXPECT_THROW(PlanGathers(sizes, repeated, GatherLimits{}), Error);
}

}  // namespace
}  // namespace ztrain::zero
