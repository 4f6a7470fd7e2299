// The whole GPT-2 model's gradients (every parameter tensor, including the tied embedding
// that receives gradient from both the embedding and the LM head) against central finite
// differences of the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/engine.h"
#include "nn/gpt2.h"
#include "finite_differences.h"
#include "test_model.h"

namespace ztrain {
namespace {

TEST(Gpt2GradientTest, MatchesFiniteDifferences) {
  const Config cfg = ParseConfig(testing::TinyConfigJson());
  Engine engine(cfg, nn::BuildGpt2(cfg.model));
  testing::OwnedBatch batch(2, 7, 11, 9);
  const int checked =
      testing::ExpectGradientsMatchFiniteDifferences(engine, batch, "wte", cfg.model.n_embd);
  EXPECT_EQ(checked, 28);  // wte, wpe, 12 per block x 2, ln_f weight and bias
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
