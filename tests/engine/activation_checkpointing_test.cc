// Activation checkpointing (Note [Activation checkpointing in the engine]): checkpointed runs
// train the same model as plain runs, bit for bit (the recompute is the same arithmetic in the
// same order: Note [Equivalence tolerances], tests/rounding_model.h), with a measurably lower
// activation peak, at ZeRO stages 0 and 3, for every block, the first N blocks, and a list.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "nn/gpt2.h"
#include "test_model.h"

namespace ztrain {
namespace {

// 4 blocks, C = 32, T = 32, a vocabulary of 11: the blocks' saved activations dominate the
// activation peak (the logits are small).
Config MakeConfig(int stage, const nlohmann::json& checkpointing) {
  nlohmann::json j = testing::TinyConfigJson(4, 32, 4, 11, 32);
  j["train_micro_batch_size_per_gpu"] = 4;
  j["gradient_accumulation_steps"] = 2;
  j.erase("train_batch_size");
  j["gradient_clipping"] = 1.0;
  j["zero_optimization"] = {{"stage", stage}};
  if (!checkpointing.is_null()) j["activation_checkpointing"] = checkpointing;
  return ParseConfig(j);
}

struct Result {
  std::vector<double> losses, norms;
  int64_t activation_peak = 0;
};

Result Train(int stage, const nlohmann::json& checkpointing) {
  const Config config = MakeConfig(stage, checkpointing);
  Engine e(config, nn::BuildGpt2(config.model));
  Result r;
  for (int step = 0; step < 4; ++step) {
    testing::OwnedBatch a(4, 32, 11, 10 * step), b(4, 32, 11, 10 * step + 1);
    const StepStats s = e.TrainStep(std::vector<nn::MicroBatch>{a.mb, b.mb});
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
  }
  r.activation_peak = e.memory().Peak(MemoryCategory::kActivations);
  return r;
}

void ExpectSameTraining(const Result& got, const Result& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_EQ(got.losses[i], want.losses[i]) << what << " step " << i;
    EXPECT_EQ(got.norms[i], want.norms[i]) << what << " step " << i;
  }
}

TEST(ActivationCheckpointingTest, SameLossesWithALowerActivationPeak) {
  for (int stage : {0, 3}) {
    const Result plain = Train(stage, nullptr);
    const Result all = Train(stage, {{"enabled", true}});
    const Result first2 = Train(stage, {{"number_checkpoints", 2}});
    const std::string s = "stage " + std::to_string(stage);
    ExpectSameTraining(all, plain, s + " all blocks");
    ExpectSameTraining(first2, plain, s + " first 2");
    // Every block checkpointed keeps one block's internals at a time instead of four.
    EXPECT_LT(all.activation_peak, 0.6 * static_cast<double>(plain.activation_peak)) << s;
    EXPECT_LT(first2.activation_peak, plain.activation_peak) << s;
    EXPECT_LT(all.activation_peak, first2.activation_peak) << s;
    std::printf("%s activation peak: plain %lld, 2 blocks %lld, all %lld bytes\n", s.c_str(),
                static_cast<long long>(plain.activation_peak),
                static_cast<long long>(first2.activation_peak),
                static_cast<long long>(all.activation_peak));
  }
}

TEST(ActivationCheckpointingTest, AListOfBlocksAndCpuCheckpointingTrainTheSame) {
  const Result plain = Train(0, nullptr);
  ExpectSameTraining(Train(0, {{"blocks", {1, 3}}}), plain, "blocks 1, 3");
  // On the CPU backend activations are host memory already: nothing moves.
  ExpectSameTraining(Train(0, {{"enabled", true}, {"cpu_checkpointing", true}}), plain,
                     "cpu_checkpointing");
}

}  // namespace
}  // namespace ztrain
