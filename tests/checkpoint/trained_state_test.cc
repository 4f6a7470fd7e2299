// Note [Checkpoints in the engine] on its own: a rank's trained state (fp32 values, Adam's m
// and v) written by SaveTrainedState from one layout and read by LoadTrainedState into another
// — dp 2 at ZeRO 1 into one process at ZeRO 0, dp 2 at ZeRO 3 into dp 4 at ZeRO 2 and ZeRO 3 —
// over real parts (the parameter table, a parameter store in host memory, the sharded
// optimizer) and real rank files, with the ranks of a layout built one after the other in one
// process (neither call is collective). Frozen parameters are not saved, and a checkpoint of
// another model is refused naming the parameter.
#include "checkpoint/trained_state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "core/memory_tracker.h"
#include "tests/expect_error.h"
#include "tests/temp_dir.h"

namespace ztrain::checkpoint {
namespace {

using offload::Place;

nn::ParamSpec Spec(const std::string& name, Shape shape, bool trainable = true) {
  nn::ParamSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.trainable = trainable;
  return s;
}

// The model: w [4, 6] and b [6]; then w1 [5, 3] and a frozen f [2, 2].
std::vector<std::vector<nn::ParamSpec>> Model(const Shape& w_shape = {4, 6}) {
  return {{Spec("w", w_shape), Spec("b", {6})},
          {Spec("w1", {5, 3}), Spec("f", {2, 2}, /*trainable=*/false)}};
}

// A kind's value of whole element i of `name`.
float Value(Kind kind, const std::string& name, int64_t i) {
  return std::sin(0.7f * static_cast<float>(i) + static_cast<float>(name.size())) +
         10.0f * static_cast<float>(kind);
}

// One rank of a layout: its table, its parameter store and its optimizer with m and v in
// memory, every held element and every element of its optimizer range set to (or read back
// against) Value.
struct Rank {
  Rank(int dp, int rank, int stage, const std::vector<std::vector<nn::ParamSpec>>& model = Model())
      : dp_rank(rank), groups(OptimizerConfig{}) {
    table = std::make_unique<zero::ParamTable>(
        zero::ParamTable::Options{
            .dp = dp,
            .rank = rank,
            .shard_optimizer = stage >= 1,
            .shard_parameters = stage == 3,
            .frozen_element_bytes = 4,
            .frozen_bytes = [](const nn::ParamSpec& s) { return NumElements(s.shape) * 4; }},
        groups);
    offload::Placement at;
    at.params = Place::kHost;
    at.optimizer = Place::kHost;
    store = std::make_unique<offload::ParamStore>(
        offload::ParamStore::Options{.placement = at}, *ops, host, host,
        [this](Place, int64_t n, MemoryCategory c, DType d) {
          Buffer b(host, d, {n}, c);
          b.Zero();
          return b;
        });
    for (const auto& params : model) {
      const zero::FlatLayout& o = table->AddLayer("layer", params, nullptr, 0).layout;
      store->AddLayer({o.padded, o.shard, o.opt_begin, o.opt_len, stage == 3});
      m.resize(m.size() + static_cast<size_t>(o.opt_len), -1.0f);
      v.resize(v.size() + static_cast<size_t>(o.opt_len), -1.0f);
    }
    zero::OptimizerHooks hooks;
    hooks.walk_state = [this](std::optional<size_t> l, const zero::StateRange& fn, bool) {
      for (size_t i = 0; i < table->num_layers(); ++i) {
        if (l && *l != i) continue;
        const int64_t base = optimizer->base(i), n = table->layer(i).layout.opt_len;
        fn(base, n, m.data() + base, v.data() + base);
      }
    };
    optimizer = std::make_unique<zero::ShardedOptimizer>(
        zero::ShardedOptimizer::Options{.optimizer = OptimizerConfig{}, .sharded = stage >= 1},
        groups, zero::OptimizedLayersOf(*table), zero::OptimizedParamsOf(*table),
        zero::ShardedOptimizer::Groups{self.get(), self.get(), self.get()}, *ops, hooks);
  }

  // Sets (`set`) or checks every element this rank holds.
  void Walk(bool set) {
    for (size_t l = 0; l < table->num_layers(); ++l) {
      Buffer staged;
      float* held = store->OpenOnHost(l, staged, MemoryCategory::kWorkspace, true);
      table->ForEachHeldPart(l, [&](const zero::ParamSlot& s, int64_t begin, int64_t end) {
        float* at = held + (s.offset - table->Held(l).begin);
        for (int64_t i = begin; i < end; ++i) {
          if (set)
            at[i] = Value(Kind::kParam, s.spec.name, i);
          else
            EXPECT_EQ(at[i], Value(Kind::kParam, s.spec.name, i)) << s.spec.name << " " << i;
        }
      });
      if (set) store->Commit(l, staged);
    }
    optimizer->ForEachRange(
        optimizer->parts(),
        [&](const zero::OptimizerPart& p, int64_t begin, int64_t end, float* pm, float* pv) {
          const zero::ParamSlot& s = table->slot(p.param);
          for (int64_t i = begin; i < end; ++i) {
            const int64_t whole = i - s.offset;
            float& mi = pm[i - begin];
            float& vi = pv[i - begin];
            if (set) {
              mi = Value(Kind::kExpAvg, s.spec.name, whole);
              vi = Value(Kind::kExpAvgSq, s.spec.name, whole);
            } else {
              EXPECT_EQ(mi, Value(Kind::kExpAvg, s.spec.name, whole)) << s.spec.name << whole;
              EXPECT_EQ(vi, Value(Kind::kExpAvgSq, s.spec.name, whole)) << s.spec.name << whole;
            }
          }
        },
        /*save=*/set);
  }

  int dp_rank;
  MemoryTracker tracker;
  HostAllocator host{&tracker};
  std::unique_ptr<kernels::Ops> ops = kernels::MakeCpuOps();
  std::unique_ptr<comm::Communicator> self = comm::MakeSelfCommunicator();
  optim::ParamGroups groups;
  std::unique_ptr<zero::ParamTable> table;
  std::unique_ptr<offload::ParamStore> store;
  std::vector<float> m, v;
  std::unique_ptr<zero::ShardedOptimizer> optimizer;
};

// Every rank of a (dp, stage) layout saves its file into `dir`; returns meta.json's files.
nlohmann::json SaveLayout(const std::string& dir, int dp, int stage) {
  nlohmann::json files = nlohmann::json::array();
  for (int r = 0; r < dp; ++r) {
    Rank rank(dp, r, stage);
    rank.Walk(/*set=*/true);
    ShardWriter writer(dir + "/" + RankFileName(r));
    SaveTrainedState(*rank.table, *rank.store, *rank.optimizer,
                     {.sharded_optimizer = stage >= 1, .dp_rank = r, .tp_rank = 0}, writer);
    writer.Finish();
    files.push_back({{"name", RankFileName(r)}});
  }
  return {{"files", files}};
}

TEST(TrainedStateTest, ALayoutLoadsWhatAnotherSaved) {
  struct Case {
    int save_dp, save_stage, load_dp, load_stage;
  };
  for (const Case c : {Case{2, 1, 1, 0}, Case{2, 3, 4, 2}, Case{2, 3, 4, 3}, Case{1, 0, 2, 3}}) {
    SCOPED_TRACE(::testing::Message() << "dp " << c.save_dp << " stage " << c.save_stage
                                      << " into dp " << c.load_dp << " stage " << c.load_stage);
    testing::TempDir dir;
    const nlohmann::json meta = SaveLayout(dir.path(), c.save_dp, c.save_stage);
    const ModelIndex index(dir.path(), meta);
    // Whole parameters, each once over the files; the frozen f is not there.
    EXPECT_EQ(index.parameters().size(), 3u);
    for (const auto& [name, shape] : index.parameters()) EXPECT_NE(name, "f");
    for (int r = 0; r < c.load_dp; ++r) {
      Rank rank(c.load_dp, r, c.load_stage);
      LoadTrainedState(*rank.table, *rank.store, *rank.optimizer, index);
      rank.Walk(/*set=*/false);
    }
  }
}

TEST(TrainedStateTest, ACheckpointOfAnotherModelIsRefusedNamingTheParameter) {
  testing::TempDir dir;
  const ModelIndex index(dir.path(), SaveLayout(dir.path(), 1, 0));
  Rank wider(1, 0, 0, Model({4, 7}));
  testing::ExpectErrorWith<Error>(
      [&] { LoadTrainedState(*wider.table, *wider.store, *wider.optimizer, index); },
      {"parameter 'w' is [4, 6] in the checkpoint but [4, 7] in this model"});
  std::vector<std::vector<nn::ParamSpec>> renamed = Model();
  renamed[0][1].name = "bias";
  Rank other(1, 0, 0, renamed);
  testing::ExpectErrorWith<Error>(
      [&] { LoadTrainedState(*other.table, *other.store, *other.optimizer, index); },
      {"the checkpoint has no parameter 'bias'", "saved from another model"});
}

}  // namespace
}  // namespace ztrain::checkpoint
