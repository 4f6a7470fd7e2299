#pragma once
// The equivalence rule's common part for the multi-rank engine tests: a parallel engine and a
// single-process engine trained side by side on the same global batches, and their
// parameters compared, within Note [Equivalence tolerances] (tests/rounding_model.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "nn/context_parallel.h"
#include "test_model.h"
#include "tests/rounding_model.h"

namespace ztrain::testing {

inline nn::MicroBatch Rows(const nn::MicroBatch& mb, int64_t begin, int64_t end) {
  return {mb.tokens.Slice(begin, end), mb.targets.Slice(begin, end),
          mb.positions.defined() ? mb.positions.Slice(begin, end) : Tensor()};
}

// Context parallelism (Note [Context parallelism]): piece `cp_rank` of `cp_size` of each
// micro-batch, kept alive in `hold`; the micro-batches themselves for one piece.
inline std::vector<nn::MicroBatch> Pieces(
    const std::vector<nn::MicroBatch>& whole, int cp_rank, int cp_size,
    std::vector<std::unique_ptr<nn::ContextMicroBatch>>& hold,
    nn::ContextAlgorithm algorithm = nn::ContextAlgorithm::kUlysses) {
  if (cp_size == 1) return whole;
  std::vector<nn::MicroBatch> out;
  for (const nn::MicroBatch& mb : whole) {
    out.push_back(
        hold.emplace_back(std::make_unique<nn::ContextMicroBatch>(mb, cp_rank, cp_size, algorithm))
            ->mb);
  }
  return out;
}

// The model of Note [Equivalence tolerances] for `single`'s config training `steps` steps of
// `gas` micro-batches of `rows` sequences of T = 8 tokens (TrainSideBySide's batches).
inline EquivalenceCheck CheckFor(const Engine& single, int64_t rows, int gas, int steps) {
  const Config& c = single.config();
  return EquivalenceCheck(ModelFor(c, single.NumParameters(), rows * 8 * gas, steps),
                          c.model.n_embd);
}

// `steps` steps of `gas` global micro-batches of b x ranks rows (T = 8, vocabulary 11):
// `parallel` trains rows [rank*b, (rank+1)*b) of each, `single` all of them. Every step's
// loss and gradient norm go to `check`, and the token counts must agree exactly. Returns the
// sum of the steps' learning rates. With `packed` the batches are packed documents, each
// starting at token kPackedStart (OwnedBatch::Pack). Under context parallelism `parallel` trains
// piece `cp_rank` of `cp_size` of each of its rows.
inline double TrainSideBySide(Engine& parallel, Engine& single, int steps, int gas, int64_t b,
                              int ranks, int rank, EquivalenceCheck& check, bool packed = false,
                              int cp_rank = 0, int cp_size = 1,
                              nn::ContextAlgorithm algorithm = nn::ContextAlgorithm::kUlysses) {
  double lr_sum = 0.0;
  for (int step = 0; step < steps; ++step) {
    std::vector<OwnedBatch> global;
    std::vector<nn::MicroBatch> mine, all;
    for (int m = 0; m < gas; ++m) global.emplace_back(b * ranks, 8, 11, 1000 * step + m);
    for (auto& g : global) {
      if (packed) g.Pack();
      mine.push_back(Rows(g.mb, rank * b, (rank + 1) * b));
      all.push_back(g.mb);
    }
    std::vector<std::unique_ptr<nn::ContextMicroBatch>> hold;
    const StepStats p = parallel.TrainStep(Pieces(mine, cp_rank, cp_size, hold, algorithm));
    const StepStats s = single.TrainStep(all);
    check.Step(step + 1, p.loss, s.loss, p.grad_norm, s.grad_norm, lr_sum);
    EXPECT_EQ(p.tokens, s.tokens) << "step " << step + 1;
    EXPECT_EQ(p.documents, s.documents) << "step " << step + 1;
    if (packed) {
      EXPECT_GT(s.documents, gas * b * ranks) << "step " << step + 1;
    }
    lr_sum += s.lr;
  }
  return lr_sum;
}

// Fails the test with every value `check` found out of its tolerance, and prints the
// headroom of each kind of check.
inline void ExpectWithinRounding(const EquivalenceCheck& check, const std::string& label) {
  check.Report(label);
  for (const std::string& f : check.failures()) ADD_FAILURE() << label << ": " << f;
}

}  // namespace ztrain::testing
