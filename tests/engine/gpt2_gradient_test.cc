// The whole GPT-2 model's gradients (every parameter tensor, including the tied embedding
// that receives gradient from both the embedding and the LM head) against central finite
// differences of the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/engine.h"
#include "nn/gpt2.h"
#include "test_model.h"

namespace ztrain {
namespace {

TEST(Gpt2GradientTest, MatchesFiniteDifferences) {
  const Config cfg = ParseConfig(testing::TinyConfigJson());
  Engine engine(cfg, nn::BuildGpt2(cfg.model));
  // Larger weights than GPT-2's init make every gradient large enough for fp32 differences.
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.f, 0.3f);
  for (const std::string& name : engine.ParameterNames()) {
    Tensor p = engine.Parameter(name);
    for (int64_t i = 0; i < p.numel(); ++i) p.data<float>()[i] += d(rng);
  }
  testing::OwnedBatch batch(2, 7, 11, 9);
  engine.ZeroGrad();
  const double loss = engine.ForwardBackward(batch.mb, 1.0f);
  EXPECT_NEAR(loss, engine.EvalLoss(batch.mb), 1e-6);
  int checked = 0;
  for (const std::string& name : engine.ParameterNames()) {
    Tensor p = engine.Parameter(name);
    Tensor g = engine.Gradient(name);
    std::uniform_int_distribution<int64_t> pick(0, p.numel() - 1);
    for (int k = 0; k < 6; ++k) {
      // For wte, look at rows of tokens that occur, where both uses contribute.
      const int64_t i = name == "wte" ? batch.tokens[k] * 8 + k % 8 : pick(rng);
      float* x = p.data<float>() + i;
      const float saved = *x;
      const float eps = 1e-2f;
      *x = saved + eps;
      const double up = engine.EvalLoss(batch.mb);
      *x = saved - eps;
      const double down = engine.EvalLoss(batch.mb);
      *x = saved;
      const double fd = (up - down) / (2.0 * eps);
      const double an = g.data<float>()[i];
      EXPECT_NEAR(an, fd, 2e-2 * std::max(std::fabs(fd), std::fabs(an)) + 3e-4)
          << name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6 * 28);  // wte, wpe, 12 per block x 2, ln_f weight and bias
}

TEST(Gpt2GradientTest, GradientsAccumulateOverMicroBatches) {
  const Config cfg = ParseConfig(testing::TinyConfigJson());
  Engine engine(cfg, nn::BuildGpt2(cfg.model));
  testing::OwnedBatch a(2, 8, 11, 1), b(2, 8, 11, 2);
  engine.ZeroGrad();
  engine.ForwardBackward(a.mb, 0.5f);
  engine.ForwardBackward(b.mb, 0.5f);
  std::vector<float> both(engine.Gradient("h.1.mlp.c_fc.weight").numel());
  std::copy_n(engine.Gradient("h.1.mlp.c_fc.weight").data<float>(), both.size(), both.begin());
  engine.ZeroGrad();
  engine.ForwardBackward(a.mb, 0.5f);
  std::vector<float> only_a(both.size());
  std::copy_n(engine.Gradient("h.1.mlp.c_fc.weight").data<float>(), both.size(), only_a.begin());
  engine.ZeroGrad();
  engine.ForwardBackward(b.mb, 0.5f);
  const float* only_b = engine.Gradient("h.1.mlp.c_fc.weight").data<float>();
  for (size_t i = 0; i < both.size(); ++i) ASSERT_NEAR(both[i], only_a[i] + only_b[i], 1e-6);
}

}  // namespace
}  // namespace ztrain
