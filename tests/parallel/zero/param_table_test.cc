// Note [Parameter table]: each owned parameter's slot at its layout offset and in its group,
// tied uses binding their owner's slot (and the layers whose buffers a layer binds), a weight
// tied across pipeline stages held under its owner's name at offset 0, frozen parameters in
// bytes of their region, and the errors for names used twice and ties that do not resolve.
#include "parallel/zero/param_table.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "core/config.h"
#include "core/error.h"

namespace ztrain::zero {
namespace {

nn::ParamSpec Spec(const std::string& name, Shape shape, const std::string& tied_to = "") {
  nn::ParamSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.tied_to = tied_to;
  return s;
}

nn::ParamSpec Frozen(nn::ParamSpec s) {
  s.trainable = false;
  return s;
}

OptimizerConfig WithDecay() {
  OptimizerConfig c;
  c.weight_decay = 0.1;
  return c;
}

struct Table {
  explicit Table(int dp = 1, int rank = 0, bool stage3 = false) : groups(WithDecay()) {
    ParamTable::Options o;
    o.dp = dp;
    o.rank = rank;
    o.shard_optimizer = dp > 1;
    o.shard_parameters = stage3;
    o.frozen_element_bytes = 2;  // bf16
    o.frozen_bytes = [](const nn::ParamSpec& spec) { return NumElements(spec.shape) * 2; };
    table = std::make_unique<ParamTable>(o, groups);
  }
  optim::ParamGroups groups;
  std::unique_ptr<ParamTable> table;
};

TEST(ParamTableTest, OwnedParametersGetSlotsAtTheirLayoutOffsetsInTheirGroups) {
  Table t;
  const LayerSlots& l0 =
      t.table->AddLayer("block0", {Spec("w", {4, 5}), Spec("b", {5})}, nullptr, 0);
  // 20 elements, then the bias at the next 16-element boundary; padded to a multiple of 16.
  EXPECT_EQ(l0.layout.padded, 48);
  const ParamSlot& w = t.table->Find("w");
  const ParamSlot& b = t.table->Find("b");
  EXPECT_EQ(w.offset, 0);
  EXPECT_EQ(b.offset, 32);
  EXPECT_EQ(b.layer, 0u);
  // The default rules: weight decay on the matrix, off the bias.
  EXPECT_GT(t.groups[w.group].weight_decay, 0.0);
  EXPECT_EQ(t.groups[b.group].weight_decay, 0.0);
  t.table->AddLayer("block1", {Spec("w1", {3, 3})}, nullptr, 0);
  EXPECT_EQ(t.table->Find("w1").layer, 1u);
  EXPECT_EQ(t.table->Find("w1").offset, 0);
  EXPECT_EQ(t.table->layer(1).owned, std::vector<size_t>({2}));
  EXPECT_EQ(t.table->NumParameters(), 20 + 5 + 9);
}

TEST(ParamTableTest, ATiedUseBindsItsOwnersSlotAndItsLayer) {
  Table t;
  t.table->AddLayer("wte", {Spec("wte.weight", {10, 4})}, nullptr, 0);
  t.table->AddLayer("block", {Spec("w", {4, 4})}, nullptr, 0);
  const LayerSlots& head = t.table->AddLayer(
      "head", {Spec("ln.weight", {4}), Spec("lm_head", {10, 4}, "wte.weight")}, nullptr, 0);
  EXPECT_EQ(head.owned.size(), 1u);
  EXPECT_EQ(head.bound, std::vector<size_t>({2, 0}));  // its norm's slot, then the embedding's
  EXPECT_EQ(head.units, std::vector<size_t>({2, 0}));  // its own buffer and layer 0's
  EXPECT_EQ(head.layout.offsets[1], -1);               // no place of its own
  EXPECT_TRUE(t.table->layer(0).tie_owner);
  EXPECT_FALSE(t.table->layer(1).tie_owner);
  EXPECT_FALSE(t.table->Has("lm_head"));
  EXPECT_EQ(t.table->NumParameters(), 40 + 16 + 4);  // the tied weight once
}

TEST(ParamTableTest, TheStageHoldingACopyStoresItUnderItsOwnersNameAtOffsetZero) {
  Table t;
  // The last stage of a pipeline: its head ties to the embedding on stage 0.
  const pipeline::StageTie tie{.layer = 0, .copy = true, .name = "wte.weight"};
  const LayerSlots& head = t.table->AddLayer(
      "head", {Spec("ln.weight", {4}), Spec("lm_head", {10, 4}, "wte.weight")}, &tie, 64);
  const ParamSlot& copy = t.table->Find("wte.weight");
  EXPECT_TRUE(copy.stage_copy);
  EXPECT_EQ(copy.offset, 0);  // first, as on the owner's stage
  EXPECT_EQ(t.table->Find("ln.weight").offset, 48);
  EXPECT_EQ(head.layout.padded, 64);  // at least the size the owner's layer has
}

TEST(ParamTableTest, AFrozenWeightTiedToAnotherStagesIsThisStagesOwnFrozenCopy) {
  Table t;
  t.table->AddLayer("head", {Frozen(Spec("w", {4, 8})), Frozen(Spec("lm_head", {10, 4}, "wte"))},
                    nullptr, 0);
  const ParamSlot& copy = t.table->Find("wte");
  EXPECT_TRUE(copy.frozen());
  EXPECT_TRUE(copy.stage_copy);
  EXPECT_EQ(copy.offset, 64);                     // bytes: after the 32 bf16 values of "w"
  EXPECT_EQ(t.table->layer(0).layout.padded, 0);  // nothing trained
  EXPECT_EQ(t.groups[copy.group].name, "frozen");
  EXPECT_EQ(t.table->NumParameters(/*trainable_only=*/true), 0);
  EXPECT_EQ(t.table->NumParameters(), 32 + 40);
}

TEST(ParamTableTest, ShardsSplitEachLayerOverTheDataParallelRanks) {
  Table t(/*dp=*/4, /*rank=*/2);
  const LayerSlots& l = t.table->AddLayer("block", {Spec("w", {10, 10})}, nullptr, 0);
  EXPECT_EQ(l.layout.padded, 128);  // a multiple of 4 x 16
  EXPECT_EQ(l.layout.shard, 32);
  EXPECT_EQ(l.layout.opt_begin, 64);  // rank 2's shard
  EXPECT_EQ(l.layout.opt_len, 32);
}

// The parts of each trained parameter a rank holds, as (name, begin, end) of its elements.
std::vector<std::tuple<std::string, int64_t, int64_t>> HeldParts(const ParamTable& table,
                                                                 size_t l) {
  std::vector<std::tuple<std::string, int64_t, int64_t>> parts;
  table.ForEachHeldPart(l, [&](const ParamSlot& s, int64_t begin, int64_t end) {
    parts.emplace_back(s.spec.name, begin, end);
  });
  return parts;
}

TEST(ParamTableTest, AtStageThreeARankHoldsTheElementsOfItsShard) {
  // [w 40 | pad 8 | b 10 | frozen f | pad] = 64 elements over 4 ranks: shards of 16.
  const std::vector<nn::ParamSpec> params = {Spec("w", {8, 5}), Spec("b", {10}),
                                             Frozen(Spec("f", {4, 4}))};
  using Parts = std::vector<std::tuple<std::string, int64_t, int64_t>>;
  const std::vector<Parts> expected = {{{"w", 0, 16}},
                                       {{"w", 16, 32}},
                                       {{"w", 32, 40}},  // then padding
                                       {{"b", 0, 10}}};
  for (int rank = 0; rank < 4; ++rank) {
    Table t(/*dp=*/4, rank, /*stage3=*/true);
    t.table->AddLayer("block", params, nullptr, 0);
    EXPECT_EQ(t.table->Held(0).begin, 16 * rank);
    EXPECT_EQ(t.table->Held(0).count, 16);
    EXPECT_EQ(HeldParts(*t.table, 0), expected[static_cast<size_t>(rank)]) << "rank " << rank;
  }
  // Below stage 3 every rank holds the whole layer.
  Table whole(/*dp=*/4, /*rank=*/3, /*stage3=*/false);
  whole.table->AddLayer("block", params, nullptr, 0);
  EXPECT_EQ(whole.table->Held(0).begin, 0);
  EXPECT_EQ(whole.table->Held(0).count, 64);
  EXPECT_EQ(HeldParts(*whole.table, 0), Parts({{"w", 0, 40}, {"b", 0, 10}}));
}

TEST(ParamTableTest, BadNamesAndTiesAreErrorsNamingThem) {
  Table t;
  t.table->AddLayer("a", {Spec("w", {2, 2})}, nullptr, 0);
  try {
    t.table->AddLayer("b", {Spec("w", {2, 2})}, nullptr, 0);
    ADD_FAILURE() << "a name used twice";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w' is used twice"), std::string::npos) << e.what();
  }
  Table u;
  u.table->AddLayer("a", {Spec("w", {2, 2})}, nullptr, 0);
  try {
    u.table->AddLayer("head", {Spec("h", {2, 2}, "nowhere")}, nullptr, 0);
    ADD_FAILURE() << "a tie to nothing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer head ties 'h' to 'nowhere', which no earlier"),
              std::string::npos)
        << e.what();
  }
  Table v;
  v.table->AddLayer("a", {Spec("w", {2, 2})}, nullptr, 0);
  try {
    v.table->AddLayer("head", {Spec("h", {2, 3}, "w")}, nullptr, 0);
    ADD_FAILURE() << "a tie of another shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape [2, 3] but 'w' has [2, 2]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(v.table->Find("nothing"), Error);
}

}  // namespace
}  // namespace ztrain::zero
