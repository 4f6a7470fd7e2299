#pragma once
// The whole model's gradients against central finite differences of the loss, shared by the
// families' gradient tests (gpt2_gradient_test, llama_gradient_test).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "engine/engine.h"
#include "test_model.h"

namespace ztrain::testing {

// Perturbs the weights (larger than the init, so every gradient is large enough for fp32
// differences), takes the loss's gradient on `batch` and checks `per_tensor` elements of every
// parameter tensor against (L(w + eps) - L(w - eps)) / 2 eps. In the token table
// `token_table` ([Vp, channels]) it looks at rows of tokens that occur, where both uses of a
// tied table contribute. Frozen parameters (LoRA's base) are perturbed too and have no
// gradient to check. `eps` is the step of the differences: LoRA's products of perturbed
// adapters curve the loss more, and take a smaller one. Returns the tensors checked.
inline int ExpectGradientsMatchFiniteDifferences(Engine& engine, const OwnedBatch& batch,
                                                 const std::string& token_table, int64_t channels,
                                                 int per_tensor = 6, float eps = 1e-2f) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.f, 0.3f);
  for (const std::string& name : engine.ParameterNames()) {
    Tensor p = engine.Parameter(name);
    for (int64_t i = 0; i < p.numel(); ++i) p.data<float>()[i] += d(rng);
  }
  engine.ZeroGrad();
  const double loss = engine.ForwardBackward(batch.mb, 1.0f);
  EXPECT_NEAR(loss, engine.EvalLoss(batch.mb), 1e-6);
  int tensors = 0;
  for (const std::string& name : engine.ParameterNames()) {
    if (!engine.Trainable(name)) continue;
    Tensor p = engine.Parameter(name);
    Tensor g = engine.Gradient(name);
    std::uniform_int_distribution<int64_t> pick(0, p.numel() - 1);
    for (int k = 0; k < per_tensor; ++k) {
      const int64_t i =
          name == token_table ? batch.tokens[k] * channels + k % channels : pick(rng);
      float* x = p.data<float>() + i;
      const float saved = *x;
      *x = saved + eps;
      const double up = engine.EvalLoss(batch.mb);
      *x = saved - eps;
      const double down = engine.EvalLoss(batch.mb);
      *x = saved;
      const double fd = (up - down) / (2.0 * eps);
      const double an = g.data<float>()[i];
      EXPECT_NEAR(an, fd, 2e-2 * std::max(std::fabs(fd), std::fabs(an)) + 3e-4)
          << name << "[" << i << "]";
    }
    ++tensors;
  }
  return tensors;
}

}  // namespace ztrain::testing
