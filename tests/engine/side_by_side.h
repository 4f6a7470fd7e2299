#pragma once
// The equivalence rule's common part for the multi-rank engine tests: a parallel engine and a
// single-process engine trained side by side on the same global batches, and their
// parameters compared.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "test_model.h"

namespace ztrain::testing {

inline nn::MicroBatch Rows(const nn::MicroBatch& mb, int64_t begin, int64_t end) {
  return {mb.tokens.Slice(begin, end), mb.targets.Slice(begin, end)};
}

// `steps` steps of `gas` global micro-batches of b x ranks rows (T = 8, vocabulary 11):
// `parallel` trains rows [rank*b, (rank+1)*b) of each, `single` all of them. Every step's
// loss and gradient norm must agree within `tolerance` (relative; 1e-5 for fp32), and the
// token counts exactly. `lr_sum`, when given, receives the sum of the steps' learning rates.
inline void TrainSideBySide(Engine& parallel, Engine& single, int steps, int gas, int64_t b,
                            int ranks, int rank, double tolerance = 1e-5,
                            double* lr_sum = nullptr) {
  for (int step = 0; step < steps; ++step) {
    std::vector<OwnedBatch> global;
    std::vector<nn::MicroBatch> mine, all;
    for (int m = 0; m < gas; ++m) global.emplace_back(b * ranks, 8, 11, 1000 * step + m);
    for (auto& g : global) {
      mine.push_back(Rows(g.mb, rank * b, (rank + 1) * b));
      all.push_back(g.mb);
    }
    const StepStats p = parallel.TrainStep(mine);
    const StepStats s = single.TrainStep(all);
    ASSERT_NEAR(p.loss, s.loss, tolerance * std::fabs(s.loss)) << "step " << step;
    ASSERT_NEAR(p.grad_norm, s.grad_norm, tolerance * s.grad_norm) << "step " << step;
    ASSERT_EQ(p.tokens, s.tokens);
    if (lr_sum) *lr_sum += s.lr;
  }
}

// Expects parameter `name` of the parallel run (`a`) within tolerance (1 + |e|) of the single
// process's (`e`), element by element.
inline void ExpectParameterNear(const std::string& name, const Tensor& a, const Tensor& e,
                                double tolerance = 1e-5) {
  ASSERT_EQ(a.numel(), e.numel()) << name;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.data<float>()[i], y = e.data<float>()[i];
    ASSERT_NEAR(x, y, tolerance * (1.0 + std::fabs(y))) << name << "[" << i << "]";
  }
}

}  // namespace ztrain::testing
