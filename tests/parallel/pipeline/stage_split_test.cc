// pipeline::SplitStages (Note [Weights tied across stages]): which layers a stage runs, the
// weights it shares with another stage, and the flat size both sharing layers must hold,
// checked against zero::TiedLayoutSize and by hand on a GPT-2-shaped model; and
// pipeline::StageModel on a real GPT-2 model: the stage's layers, its input's shape, and the
// whole model's parameters each once.
#include "parallel/pipeline/stage_split.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "nn/gpt2.h"
#include "tests/nn/staged_gpt2.h"
#include "parallel/zero/flat_layout.h"

namespace ztrain::pipeline {
namespace {

// GPT-2's shape: an embedding owning wte and wpe, `blocks` blocks of 100 elements, and a head
// whose ln_f comes first and whose lm_head is tied to wte.
struct Model {
  std::vector<std::vector<StageParam>> layers;
  std::vector<std::string> names;
};

Model Gpt2(int blocks, bool frozen_head = false) {
  Model m;
  m.layers.push_back({{"wte", "", 64, true, false}, {"wpe", "", 16, true, false}});
  m.names.push_back("embedding");
  for (int b = 0; b < blocks; ++b) {
    const std::string index = std::to_string(b);
    m.layers.push_back({{std::string("h").append(index).append(".w"), "", 100, true, false}});
    m.names.push_back(std::string("block").append(index));
  }
  m.layers.push_back({{"ln_f.w", "", 8, true, false}, {"lm_head", "wte", 64, !frozen_head, false}});
  m.names.push_back("head");
  return m;
}

TEST(StageSplitTest, OneStageRunsEverythingAndSharesNothing) {
  const Model m = Gpt2(4);
  const StageSplit s = SplitStages(m.layers, m.names, 1, 0, PartitionMethod::kParameters);
  EXPECT_EQ(s.bounds, (std::vector<int>{0, 6}));
  EXPECT_EQ(s.begin, 0u);
  EXPECT_EQ(s.end, 6u);
  EXPECT_TRUE(s.ties.empty());
  EXPECT_EQ(s.min_padded, std::vector<int64_t>(6, 0));
}

TEST(StageSplitTest, BothStagesHoldTheTiedEmbeddingAtTheSameSize) {
  const Model m = Gpt2(4);
  const StageSplit first = SplitStages(m.layers, m.names, 2, 0, PartitionMethod::kUniform);
  const StageSplit last = SplitStages(m.layers, m.names, 2, 1, PartitionMethod::kUniform);
  EXPECT_EQ(first.bounds, (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(last.bounds, first.bounds);
  EXPECT_EQ(first.begin, 0u);
  EXPECT_EQ(last.begin, 3u);
  EXPECT_EQ(last.end, 6u);
  ASSERT_EQ(first.ties.size(), 1u);
  ASSERT_EQ(last.ties.size(), 1u);
  // The owner's stage holds the original in its first layer, the last stage the copy in
  // its last layer (index 2 within the stage), both under the owner's name.
  EXPECT_EQ(first.ties[0].layer, 0u);
  EXPECT_FALSE(first.ties[0].copy);
  EXPECT_EQ(first.ties[0].peer, 1);
  EXPECT_EQ(last.ties[0].layer, 2u);
  EXPECT_TRUE(last.ties[0].copy);
  EXPECT_EQ(last.ties[0].peer, 0);
  EXPECT_EQ(first.ties[0].name, "wte");
  EXPECT_EQ(last.ties[0].name, "wte");
  EXPECT_EQ(first.ties[0].elements, 64);
  // wte first, then wpe (16) on the owner; lm_head first, then ln_f (8) on the copy: both
  // layers are padded to the larger, 80.
  const int64_t size = 64 + 16;
  EXPECT_EQ(zero::TiedLayoutSize({{"wte", 64}, {"wpe", 16}}, "wte"), size);
  EXPECT_EQ(first.min_padded, (std::vector<int64_t>{size, 0, 0}));
  EXPECT_EQ(last.min_padded, (std::vector<int64_t>{0, 0, size}));
}

TEST(StageSplitTest, AMiddleStageSharesNothingAndATieWithinAStageIsNone) {
  const Model m = Gpt2(4);
  const StageSplit middle = SplitStages(m.layers, m.names, 3, 1, PartitionMethod::kUniform);
  EXPECT_TRUE(middle.ties.empty());
  EXPECT_EQ(middle.min_padded, std::vector<int64_t>(middle.end - middle.begin, 0));
  // Two stages by parameters: embedding (80) and the blocks on one side, but the head's tie
  // stays a tie only when the head is on the other stage.
  const StageSplit only = SplitStages(m.layers, m.names, 2, 0, PartitionMethod::kParameters);
  const bool head_elsewhere = only.end < m.layers.size();
  EXPECT_EQ(only.ties.size(), head_elsewhere ? 1u : 0u);
}

TEST(StageSplitTest, AFrozenTiedUseMakesNoTie) {
  const Model m = Gpt2(4, /*frozen_head=*/true);
  for (int stage = 0; stage < 2; ++stage) {
    const StageSplit s = SplitStages(m.layers, m.names, 2, stage, PartitionMethod::kUniform);
    EXPECT_TRUE(s.ties.empty()) << stage;
    EXPECT_EQ(s.min_padded, std::vector<int64_t>(3, 0));
  }
}

TEST(StageSplitTest, TheStagesCountEveryParameter) {
  // By parameters, with the tied lm_head counted: [emb 80 + lm 64 + ln 8] are on the ends.
  Model m = Gpt2(2);
  m.layers[1][0].elements = 1000;  // a heavy first block gets a stage of its own
  const StageSplit s = SplitStages(m.layers, m.names, 3, 0, PartitionMethod::kParameters);
  EXPECT_EQ(s.bounds, PartitionLayers(std::vector<int64_t>{80, 1000, 100, 72}, 3,
                                      PartitionMethod::kParameters));
}

TEST(StageSplitTest, ALayerSharingTwoWeightsAcrossStagesIsNamed) {
  Model m = Gpt2(4);
  m.layers.back().push_back({"pos_head", "wpe", 16, true, false});
  try {
    SplitStages(m.layers, m.names, 2, 0, PartitionMethod::kUniform);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("shares more than one weight"), std::string::npos) << what;
    EXPECT_NE(what.find("embedding"), std::string::npos) << what;
  }
}

TEST(StageModelTest, TheStageKeepsItsLayersAndKnowsTheWholeModel) {
  ModelConfig m = testing::TinyGpt2Config();  // C = 8, maxT 8
  m.n_layer = 4;
  // Embedding, 4 blocks, head: 6 layers, cut uniformly in two.
  StageModel last(nn::BuildGpt2(m), 2, 1, PartitionMethod::kUniform);
  const std::vector<std::unique_ptr<nn::Layer>> layers = last.TakeLayers();
  ASSERT_EQ(layers.size(), last.split().end - last.split().begin);
  EXPECT_EQ(layers.back()->Name(), nn::BuildGpt2(m).back()->Name());
  EXPECT_EQ(last.InputShape({2, 8}), (Shape{2, 8, 8}));  // a block's output: [B, T, C]
  ASSERT_EQ(last.specs().size(), 6u);                    // every layer's, not the stage's
  // The head shares the token embedding with stage 0, and holds its copy.
  ASSERT_NE(last.TieOf(layers.size() - 1), nullptr);
  EXPECT_TRUE(last.TieOf(layers.size() - 1)->copy);
  EXPECT_EQ(last.TieOf(0), nullptr);
  EXPECT_NE(last.Describe().find("stage 1 of 2 runs layers"), std::string::npos) << last.Describe();
  StageModel first(nn::BuildGpt2(m), 2, 0, PartitionMethod::kUniform);
  EXPECT_EQ(first.InputShape({2, 8}), (Shape{2, 8}));  // the tokens
  // The whole model's parameters, the same on both stages, the tied weight once.
  const std::vector<std::pair<std::string, Shape>> params = first.Parameters();
  EXPECT_EQ(params, last.Parameters());
  int64_t whole = 0;
  for (const auto& [name, shape] : params) {
    EXPECT_NE(name, "lm_head.weight");
    whole += NumElements(shape);
  }
  int64_t declared = 0;
  for (const auto& layer : nn::BuildGpt2(m)) {
    for (const nn::ParamSpec& s : layer->Params())
      declared += s.tied_to.empty() ? NumElements(s.shape) : 0;
  }
  EXPECT_EQ(whole, declared);
}

}  // namespace
}  // namespace ztrain::pipeline
