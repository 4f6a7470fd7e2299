#pragma once
// The whole model's gradients against central finite differences of the loss, shared by the
// families' gradient tests (gpt2_gradient_test, llama_gradient_test).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "test_model.h"

namespace ztrain::testing {

// Perturbs the weights (larger than the init, so every gradient is large enough for fp32
// differences), takes the loss's gradient on `batch` and checks `per_tensor` elements of every
// parameter tensor against (L(w + eps) - L(w - eps)) / 2 eps. In the token table
// `token_table` ([Vp, channels]) it looks at rows of tokens that occur, where both uses of a
// tied table contribute. Frozen parameters (LoRA's base) are perturbed too, unless quantized,
// and have no gradient to check. `eps` is the step of the differences: LoRA's products of perturbed
// adapters curve the loss more, and take a smaller one. With `training` (LoRA dropout) the
// differences are of the training loss (Engine::ForwardBackward, which drops what the
// gradient's forward dropped), not of the evaluation loss. Returns the tensors checked.
inline int ExpectGradientsMatchFiniteDifferences(Engine& engine, const OwnedBatch& batch,
                                                 const std::string& token_table, int64_t channels,
                                                 int per_tensor = 6, float eps = 1e-2f,
                                                 bool training = false) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.f, 0.3f);
  for (const std::string& name : engine.ParameterNames()) {
    Tensor p = engine.Parameter(name);
    if (p.dtype() == DType::kU8) continue;  // a quantized base weight: its blob stays
    for (int64_t i = 0; i < p.numel(); ++i) p.data<float>()[i] += d(rng);
  }
  engine.ZeroGrad();
  const double loss = engine.ForwardBackward(batch.mb, 1.0f);
  // The gradients, kept before a training loss below accumulates more.
  std::map<std::string, std::vector<float>> grads;
  for (const std::string& name : engine.ParameterNames()) {
    if (!engine.Trainable(name)) continue;
    const Tensor g = engine.Gradient(name);
    grads[name].assign(g.data<float>(), g.data<float>() + g.numel());
  }
  const auto loss_now = [&] {
    return training ? engine.ForwardBackward(batch.mb, 1.0f) : engine.EvalLoss(batch.mb);
  };
  if (training) {
    EXPECT_EQ(loss_now(), loss) << "the training loss is not deterministic";
    EXPECT_GT(std::fabs(engine.EvalLoss(batch.mb) - loss), 1e-6) << "dropout dropped nothing";
  } else {
    EXPECT_NEAR(loss, loss_now(), 1e-6);
  }
  int tensors = 0;
  for (const std::string& name : engine.ParameterNames()) {
    if (!engine.Trainable(name)) continue;
    Tensor p = engine.Parameter(name);
    const std::vector<float>& g = grads.at(name);
    std::uniform_int_distribution<int64_t> pick(0, p.numel() - 1);
    for (int k = 0; k < per_tensor; ++k) {
      const int64_t i =
          name == token_table ? batch.tokens[k] * channels + k % channels : pick(rng);
      float* x = p.data<float>() + i;
      const float saved = *x;
      *x = saved + eps;
      const double up = loss_now();
      *x = saved - eps;
      const double down = loss_now();
      *x = saved;
      const double fd = (up - down) / (2.0 * eps);
      const double an = g[static_cast<size_t>(i)];
      EXPECT_NEAR(an, fd, 2e-2 * std::max(std::fabs(fd), std::fabs(an)) + 3e-4)
          << name << "[" << i << "]";
    }
    ++tensors;
  }
  return tensors;
}

}  // namespace ztrain::testing
