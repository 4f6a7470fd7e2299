// Note [Parameter gatherer] in one process, with gathers that are in-process fakes: what it
// launches before each position and in what order, what it waits for, what it reads ahead,
// what it releases and the memory that takes, and how a new step clears a failed one.
// tests/parallel/zero/param_gatherer_mpi_test.cc gathers across real ranks.
#include "parallel/zero/param_gatherer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/memory_tracker.h"
#include "kernels/ops.h"

namespace ztrain::zero {
namespace {

// A gather that is done at once; counts how often it was waited for.
class FakeWork final : public comm::Work {
 public:
  explicit FakeWork(int* waits) : waits_(waits) {}
  void Wait() override { ++*waits_; }
  bool Done() override { return true; }

 private:
  int* waits_;
};

// Four layers: 0 holds 64 trained elements, 1 has 32 trained and 128 frozen bytes, 2 only
// 64 frozen bytes, 3 has 16 trained elements and binds layer 0's (a tied weight).
struct Model {
  explicit Model(GatherLimits limits = {}, int read_ahead = 0, DType dtype = DType::kF32,
                 bool wraps = false, bool at_use = false)
      : memory(&tracker) {
    units = {{64, 0, {0}}, {32, 128, {1}}, {0, 64, {2}}, {16, 0, {3, 0}}};
    GatherHooks hooks;
    hooks.gather = [this](size_t u, const Buffer& whole) {
      launched.push_back(u);
      const int64_t bytes = units[u].elements * static_cast<int64_t>(DTypeSize(dtype_));
      EXPECT_EQ(whole.AsTensor(DType::kU8, {bytes}).numel(), bytes);
      std::fill_n(whole.data<uint8_t>(), bytes, static_cast<uint8_t>(u + 1));
      return std::make_shared<FakeWork>(&waits);
    };
    hooks.gather_frozen = [this](size_t u, const Buffer& whole) {
      frozen_launched.push_back(u);
      std::fill_n(whole.data<uint8_t>(), units[u].frozen_bytes, static_cast<uint8_t>(u + 101));
      return std::make_shared<FakeWork>(&waits);
    };
    if (read_ahead > 0) hooks.read_ahead = [this](size_t u) { read.push_back(u); };
    dtype_ = dtype;
    ParamGatherer::Options o;
    o.dtype = dtype;
    o.limits = limits;
    o.read_ahead = read_ahead;
    o.read_ahead_wraps = wraps;
    o.launch_at_use = at_use;
    gatherer = std::make_unique<ParamGatherer>(o, units, memory, hooks);
  }
  // Runs the positions of `phases`, checking before each layer runs that every unit it binds
  // is gathered with its own values.
  void Run(const std::vector<bool>& phases) {
    gatherer->Start(phases);
    for (const bool backward : phases) {
      for (size_t k = 0; k < units.size(); ++k) {
        const size_t l = backward ? units.size() - 1 - k : k;
        gatherer->BeforeLayer(l);
        for (size_t u : units[l].needs) ExpectGathered(u);
        gatherer->AfterLayer();
      }
    }
  }
  void ExpectGathered(size_t u) const {
    const Buffer& whole = gatherer->Whole(u);
    const Buffer& frozen = gatherer->FrozenWhole(u);
    EXPECT_EQ(whole.data() != nullptr, units[u].elements > 0) << "unit " << u;
    EXPECT_EQ(frozen.data() != nullptr, units[u].frozen_bytes > 0) << "unit " << u;
    if (whole.data() != nullptr) {
      EXPECT_EQ(whole.data<uint8_t>()[0], u + 1) << "unit " << u;
    }
    if (frozen.data() != nullptr) {
      EXPECT_EQ(frozen.data<uint8_t>()[0], u + 101) << "unit " << u;
    }
  }
  size_t Gathered() const {
    size_t n = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      n += gatherer->Whole(u).data() != nullptr || gatherer->FrozenWhole(u).data() != nullptr;
    }
    return n;
  }

  MemoryTracker tracker;
  HostAllocator memory;
  std::vector<GatherUnit> units;
  DType dtype_ = DType::kF32;
  std::vector<size_t> launched, frozen_launched, read;
  int waits = 0;
  std::unique_ptr<ParamGatherer> gatherer;
};

// Nothing persists, nothing is reused: every position gathers what it needs and releases it.
GatherLimits NoReuse() {
  return {.prefetch_bucket = 0, .max_live = 0, .max_reuse_distance = 0, .persistence_threshold = 0};
}

TEST(ParamGathererTest, GathersWhatEachLayerBindsAndReleasesAfter) {
  Model m(NoReuse());
  m.Run({false, true});
  // Forward 0, 1, 2, 3 (3 binds 0 again), backward 3 (with 0), 2, 1, 0.
  EXPECT_EQ(m.launched, (std::vector<size_t>{0, 1, 3, 0, 3, 0, 1, 0}));
  EXPECT_EQ(m.frozen_launched, (std::vector<size_t>{1, 2, 2, 1}));
  EXPECT_EQ(m.waits, static_cast<int>(m.launched.size() + m.frozen_launched.size()));
  EXPECT_EQ(m.Gathered(), 0u);
  EXPECT_EQ(m.gatherer->plan(), nullptr);  // the step is over
  EXPECT_EQ(m.tracker.Current(MemoryCategory::kParameters), 0);
  // At most a layer and the unit it ties to at once: 16 + 64 fp32 elements.
  EXPECT_EQ(m.tracker.Peak(MemoryCategory::kParameters), (16 + 64) * 4);
}

TEST(ParamGathererTest, LaunchesInPlanOrderAndKeepsWhatThePlanKeeps) {
  // Default limits: everything is prefetched at the first position and reused; nothing is
  // released before the end.
  Model m;
  m.Run({false, true, false, true});
  m.gatherer->Start({false, true, false, true});  // the same plan, to read
  const GatherPlan& plan = *m.gatherer->plan();
  std::vector<size_t> fetched;
  for (const GatherAction& a : plan.actions) {
    for (size_t u : a.fetch) {
      if (m.units[u].elements > 0) fetched.push_back(u);
    }
  }
  EXPECT_EQ(std::vector<size_t>(m.launched.begin(), m.launched.begin() + fetched.size()), fetched);
  EXPECT_EQ(m.launched.size(), fetched.size());  // the second Start only planned
  // The whole model live at once, as the plan's peak says (frozen bytes as fp32 elements).
  EXPECT_EQ(m.tracker.Peak(MemoryCategory::kParameters), plan.peak_live * 4);
  EXPECT_EQ(m.Gathered(), 0u);  // Start released what Run left (nothing)
}

TEST(ParamGathererTest, PlansAreMadeOncePerPhaseList) {
  Model m;
  m.gatherer->Start(2, /*backward=*/true);
  const GatherPlan* first = m.gatherer->plan();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->actions.size(), 2u * 2u * m.units.size());
  m.gatherer->Start(1, /*backward=*/false);
  EXPECT_EQ(m.gatherer->plan()->actions.size(), m.units.size());
  m.gatherer->Start({false, true, false, true});
  EXPECT_EQ(m.gatherer->plan(), first);
}

TEST(ParamGathererTest, GathersInTheComputeDType) {
  Model m(NoReuse(), 0, DType::kBF16);
  m.gatherer->Start(1, /*backward=*/false);
  m.gatherer->BeforeLayer(0);
  EXPECT_EQ(m.tracker.Current(MemoryCategory::kParameters), 64 * 2);
  m.gatherer->AfterLayer();
  m.gatherer->BeforeLayer(1);  // 32 bf16 elements and 128 frozen bytes
  EXPECT_EQ(m.tracker.Current(MemoryCategory::kParameters), 32 * 2 + 128);
  m.gatherer->AfterLayer();
}

TEST(ParamGathererTest, ReadsAheadTheNextPlannedGathers) {
  Model m(NoReuse(), /*read_ahead=*/2);
  m.gatherer->Start(1, /*backward=*/false);
  m.gatherer->BeforeLayer(0);
  // Positions 1 and 2 fetch units 1 and 2: both read ahead while layer 0 computes.
  EXPECT_EQ(m.read, (std::vector<size_t>{1, 2}));
  m.gatherer->AfterLayer();
  m.read.clear();
  m.gatherer->BeforeLayer(1);
  EXPECT_EQ(m.read, (std::vector<size_t>{2, 3}));  // position 3 fetches 3 and 0: one fits
  m.gatherer->AfterLayer();
  m.read.clear();
  m.gatherer->BeforeLayer(2);
  EXPECT_EQ(m.read, (std::vector<size_t>{3, 0}));
  m.gatherer->AfterLayer();
  m.read.clear();
  m.gatherer->BeforeLayer(3);
  EXPECT_TRUE(m.read.empty());  // the last position has none after it
  m.gatherer->AfterLayer();
}

TEST(ParamGathererTest, ReadAheadWrapsIntoTheNextStepsStart) {
  // The shards do not change between steps (Note [Deferred optimizer step]): the last
  // positions read ahead what the next step's first ones gather.
  Model m(NoReuse(), /*read_ahead=*/2, DType::kF32, /*wraps=*/true);
  m.gatherer->Start(1, /*backward=*/false);
  for (size_t l = 0; l < 3; ++l) {
    m.gatherer->BeforeLayer(l);
    m.gatherer->AfterLayer();
  }
  m.read.clear();
  m.gatherer->BeforeLayer(3);
  EXPECT_EQ(m.read, (std::vector<size_t>{0, 1}));  // positions 0 and 1 of the next step
  m.gatherer->AfterLayer();
}

TEST(ParamGathererTest, LaunchAtUseLaunchesAPrefetchedUnitWhenALayerNeedsIt) {
  // Default limits prefetch every unit at the first position; launched at use, each unit's
  // gathers start before the first layer that binds it, its memory taken where planned.
  Model m({}, 0, DType::kF32, /*wraps=*/false, /*at_use=*/true);
  m.gatherer->Start(1, /*backward=*/true);
  m.gatherer->BeforeLayer(0);
  m.ExpectGathered(0);
  EXPECT_EQ(m.launched, (std::vector<size_t>{0}));
  EXPECT_TRUE(m.frozen_launched.empty());
  const GatherPlan& plan = *m.gatherer->plan();
  EXPECT_EQ(m.tracker.Current(MemoryCategory::kParameters), plan.peak_live * 4);  // allocated
  m.gatherer->AfterLayer();
  m.gatherer->BeforeLayer(1);
  EXPECT_EQ(m.launched, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(m.frozen_launched, (std::vector<size_t>{1}));
  m.gatherer->AfterLayer();
  for (size_t l = 2; l < 4; ++l) {
    m.gatherer->BeforeLayer(l);
    m.gatherer->AfterLayer();
  }
  EXPECT_EQ(m.launched, (std::vector<size_t>{0, 1, 3}));  // unit 0 stayed gathered for 3
  EXPECT_EQ(m.frozen_launched, (std::vector<size_t>{1, 2}));
  // Abandoned mid-step: what was never launched is not waited for.
  m.gatherer->ReleaseAll();
  EXPECT_EQ(m.waits, 5);
  EXPECT_EQ(m.tracker.Current(MemoryCategory::kParameters), 0);
}

TEST(ParamGathererTest, StartClearsAFailedStep) {
  // A step that threw inside layer 1's forward: its gathers stay until the next Start.
  Model m(NoReuse());
  m.gatherer->Start(1, /*backward=*/true);
  m.gatherer->BeforeLayer(0);
  m.gatherer->AfterLayer();
  m.gatherer->BeforeLayer(1);
  EXPECT_EQ(m.Gathered(), 1u);
  m.gatherer->Start(1, /*backward=*/true);
  EXPECT_EQ(m.Gathered(), 0u);
  EXPECT_EQ(m.tracker.Current(MemoryCategory::kParameters), 0);
  m.launched.clear();
  m.Run({false, true});  // and the next step runs whole
  EXPECT_EQ(m.launched.size(), 8u);
}

TEST(ParamGathererTest, ReleaseAllWaitsForGathersInFlight) {
  // Everything is prefetched at the first position; layer 0 waits only for its own.
  Model m;
  m.gatherer->Start(1, /*backward=*/false);
  m.gatherer->BeforeLayer(0);
  EXPECT_EQ(m.waits, 1);
  const int launched = static_cast<int>(m.launched.size() + m.frozen_launched.size());
  EXPECT_GT(launched, 1);
  m.gatherer->ReleaseAll();
  EXPECT_EQ(m.waits, launched);
  EXPECT_EQ(m.Gathered(), 0u);
  EXPECT_EQ(m.gatherer->plan(), nullptr);
}

TEST(ParamGathererTest, AHostShardOnOneRankIsCopiedIntoItsChunkBesideTheOps) {
  const std::unique_ptr<comm::Communicator> dp = comm::MakeSelfCommunicator();
  const std::unique_ptr<kernels::Ops> ops = kernels::MakeCpuOps();
  std::vector<float> shard = {1.5f, -2.0f, 3.25f}, out(3, 0.0f);
  const Tensor out_view(out.data(), DType::kF32, {3});
  comm::WorkPtr work =
      GatherHostShard(*dp, *ops, Tensor(shard.data(), DType::kF32, {3}), out_view, out_view);
  EXPECT_FALSE(work->Done());  // done once waited for
  work->Wait();
  EXPECT_TRUE(work->Done());
  EXPECT_EQ(out, shard);
}

}  // namespace
}  // namespace ztrain::zero
