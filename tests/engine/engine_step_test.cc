// Engine::TrainStep: micro-batching is a layout, so splitting a batch into micro-batches
// must give the single-batch step (the equivalence rule); model-state memory matches its
// formula; clipping is reported as DeepSpeed computes it.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/engine.h"
#include "nn/gpt2.h"
#include "side_by_side.h"
#include "test_model.h"

namespace ztrain {
namespace {

using testing::Rows;

TEST(EngineStepTest, MicroBatchesEqualOneBigBatch) {
  nlohmann::json j = testing::TinyConfigJson(2, 16, 2, 11, 8);
  j["gradient_clipping"] = 0.5;
  j["optimizer"]["params"]["weight_decay"] = 0.1;
  const Config cfg = ParseConfig(j);
  Engine whole(cfg, nn::BuildGpt2(cfg.model));
  Engine split(cfg, nn::BuildGpt2(cfg.model));
  constexpr int kSteps = 4;
  // Note [Equivalence tolerances]: the split sums the batch's 32 tokens in another order.
  testing::EquivalenceCheck check(testing::ModelFor(cfg, whole.NumParameters(), 4 * 8, kSteps), cfg.model.n_embd);
  double lr_sum = 0.0;
  for (int step = 0; step < kSteps; ++step) {
    testing::OwnedBatch batch(4, 8, 11, 100 + step);
    const StepStats a = whole.TrainStep({&batch.mb, 1});
    const nn::MicroBatch parts[] = {Rows(batch.mb, 0, 2), Rows(batch.mb, 2, 4)};
    const StepStats b = split.TrainStep(parts);
    check.Step(step + 1, b.loss, a.loss, b.grad_norm, a.grad_norm, lr_sum);
    EXPECT_EQ(a.tokens, b.tokens);
    lr_sum += a.lr;
  }
  for (const std::string& name : whole.ParameterNames()) {
    const Tensor p = whole.Parameter(name), q = split.Parameter(name);
    check.Values(name, q.data<float>(), p.data<float>(), p.numel(), lr_sum);
  }
  testing::ExpectWithinRounding(check, "micro-batches against one batch");
}

TEST(EngineStepTest, ModelStateMemoryMatchesTheFormula) {
  const Config cfg = ParseConfig(testing::TinyConfigJson(3, 16, 2, 11, 8));
  Engine engine(cfg, nn::BuildGpt2(cfg.model));
  // Each parameter starts on a 16-element boundary inside its layer's flat buffer.
  int64_t padded = 0;
  for (const auto& layer : engine.layers()) {
    int64_t n = 0;
    for (const nn::ParamSpec& s : layer->Params()) {
      if (s.tied_to.empty()) n = (n + NumElements(s.shape) + 15) / 16 * 16;
    }
    padded += n;
  }
  const MemoryTracker& mem = engine.memory();
  EXPECT_EQ(mem.Current(MemoryCategory::kParameters), 4 * padded);
  EXPECT_EQ(mem.Current(MemoryCategory::kGradients), 4 * padded);
  EXPECT_EQ(mem.Current(MemoryCategory::kOptimizerState), 8 * padded);  // m and v
  EXPECT_EQ(mem.Current(MemoryCategory::kActivations), 0);
  testing::OwnedBatch batch(2, 8, 11, 1);
  engine.TrainStep({&batch.mb, 1});
  EXPECT_GT(mem.Peak(MemoryCategory::kActivations), 0);
  EXPECT_EQ(mem.Current(MemoryCategory::kActivations), 0);  // released after the step
}

TEST(EngineStepTest, Gpt2SmallHasLlmcParameterCount) {
  // GPT-2 124M as llm.c counts it (tied head, padded vocabulary): 124,475,904.
  ModelConfig m;  // defaults are GPT-2 small
  int64_t n = 0;
  for (const auto& layer : nn::BuildGpt2(m)) {
    for (const nn::ParamSpec& s : layer->Params()) {
      if (s.tied_to.empty()) n += NumElements(s.shape);
    }
  }
  EXPECT_EQ(n, 124475904);
}

TEST(EngineStepTest, ClippingIsReportedAsDeepSpeedComputesIt) {
  nlohmann::json j = testing::TinyConfigJson();
  j["gradient_clipping"] = 1e-3;
  const Config cfg = ParseConfig(j);
  Engine engine(cfg, nn::BuildGpt2(cfg.model));
  testing::OwnedBatch batch(2, 8, 11, 3);
  const StepStats s = engine.TrainStep({&batch.mb, 1});
  EXPECT_GT(s.grad_norm, 1e-3);
  EXPECT_NEAR(s.clip_coef, 1e-3 / (s.grad_norm + 1e-6), 1e-9);
  EXPECT_EQ(s.step, 1);
  EXPECT_EQ(engine.step(), 1);
}

}  // namespace
}  // namespace ztrain
