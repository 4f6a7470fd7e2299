// Fused softmax + cross-entropy over a padded vocabulary: losses, in-place dlogits, padding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernel_test_util.h"

namespace ztrain::kernels {
namespace {

using testing::ExpectClose;
using testing::ExpectErrorMentions;
using testing::Random;
using testing::RandomInts;
using testing::View;

// Loss of one row over columns [0, v) in double.
double RefLoss(const double* row, int64_t v, int32_t target) {
  double mx = -INFINITY, sum = 0.0;
  for (int64_t j = 0; j < v; ++j) mx = std::max(mx, row[j]);
  for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - mx);
  return std::log(sum) + mx - row[target];
}

struct CeCase {
  int64_t rows, vocab, padded;
};

// logits with NaN in the padded columns: they must never be read.
std::vector<float> MakeLogits(const CeCase& tc, uint32_t seed, float lo, float hi) {
  auto logits = Random(tc.rows * tc.padded, seed, lo, hi);
  for (int64_t r = 0; r < tc.rows; ++r) {
    for (int64_t j = tc.vocab; j < tc.padded; ++j) {
      logits[r * tc.padded + j] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  return logits;
}

TEST(CrossEntropyTest, LossMatchesReferenceAndLeavesLogitsWithoutDlosses) {
  auto ops = MakeCpuOps();
  for (CeCase tc : {CeCase{1, 1, 1}, {5, 37, 48}, {3, 50257, 50304}}) {
    SCOPED_TRACE("V=" + std::to_string(tc.vocab) + " Vp=" + std::to_string(tc.padded));
    for (float spread : {3.0f, 1000.0f}) {  // 1000: exp without max-subtraction overflows
      auto logits = MakeLogits(tc, 1, -spread, spread);
      auto targets = RandomInts(tc.rows, 2, 0, int32_t(tc.vocab));
      std::vector<float> losses(tc.rows);
      const std::vector<float> before = logits;
      ops->SoftmaxCrossEntropy(View(logits, {tc.rows, tc.padded}), View(targets, {tc.rows}),
                               tc.vocab, View(losses, {tc.rows}), Tensor());
      std::vector<double> want(tc.rows);
      const auto ld = testing::ToDouble(logits);
      for (int64_t r = 0; r < tc.rows; ++r) {
        want[r] = RefLoss(ld.data() + r * tc.padded, tc.vocab, targets[r]);
      }
      ExpectClose(losses, want, 1e-5, "losses");
      EXPECT_EQ(0, std::memcmp(before.data(), logits.data(), 4 * logits.size()))
          << "logits must be untouched when dlosses is undefined";
    }
  }
}

TEST(CrossEntropyTest, WritesDlogitsInPlaceWithZeroPadding) {
  auto ops = MakeCpuOps();
  const CeCase tc{6, 37, 48};
  auto logits = MakeLogits(tc, 3, -4.0f, 4.0f);
  auto targets = RandomInts(tc.rows, 4, 0, int32_t(tc.vocab));
  auto dlosses = Random(tc.rows, 5, 0.1f, 2.0f);
  const auto ld = testing::ToDouble(logits);
  std::vector<float> losses(tc.rows);
  ops->SoftmaxCrossEntropy(View(logits, {2, 3, tc.padded}), View(targets, {2, 3}), tc.vocab,
                           View(losses, {2, 3}), View(dlosses, {2, 3}));
  std::vector<double> want(logits.size(), 0.0), want_loss(tc.rows);
  for (int64_t r = 0; r < tc.rows; ++r) {
    const double* row = ld.data() + r * tc.padded;
    want_loss[r] = RefLoss(row, tc.vocab, targets[r]);
    for (int64_t j = 0; j < tc.vocab; ++j) {
      const double p = std::exp(row[j] - want_loss[r] - row[targets[r]]);  // softmax_j
      want[r * tc.padded + j] = (p - (j == targets[r])) * dlosses[r];
    }
  }
  ExpectClose(losses, want_loss, 1e-5, "losses");
  ExpectClose(logits, want, 1e-5, "dlogits");
  for (int64_t r = 0; r < tc.rows; ++r) {
    for (int64_t j = tc.vocab; j < tc.padded; ++j) {
      ASSERT_EQ(logits[r * tc.padded + j], 0.0f) << "padded column " << j << " of row " << r;
    }
  }
}

TEST(CrossEntropyTest, DlogitsMatchFiniteDifferences) {
  auto ops = MakeCpuOps();
  const CeCase tc{4, 29, 32};
  auto logits = Random(tc.rows * tc.padded, 6, -3.0f, 3.0f);
  auto targets = RandomInts(tc.rows, 7, 0, int32_t(tc.vocab));
  auto dlosses = Random(tc.rows, 8);
  const std::vector<float> x = logits;
  std::vector<float> losses(tc.rows);
  ops->SoftmaxCrossEntropy(View(logits, {tc.rows, tc.padded}), View(targets, {tc.rows}),
                           tc.vocab, View(losses, {tc.rows}), View(dlosses, {tc.rows}));
  auto objective = [&](const std::vector<double>& v) {
    double s = 0.0;
    for (int64_t r = 0; r < tc.rows; ++r) {
      s += dlosses[r] * RefLoss(v.data() + r * tc.padded, tc.vocab, targets[r]);
    }
    return s;
  };
  // Padded columns do not enter the objective: their difference quotient is 0 as well.
  testing::ExpectGradMatchesFiniteDiff(logits, objective, x, 1000, 1e-4, "dlogits");
}

// kIgnoreTarget (Hugging Face's ignore_index): loss 0 and a zero row of dlogits, padding
// included; the other rows are what they are without the ignored ones.
TEST(CrossEntropyTest, IgnoredTargetsTakeNoLossAndNoGradient) {
  auto ops = MakeCpuOps();
  const CeCase tc{4, 37, 48};
  auto logits = MakeLogits(tc, 9, -4.0f, 4.0f);
  std::vector<int32_t> targets = {3, kIgnoreTarget, 30, kIgnoreTarget};
  auto dlosses = Random(tc.rows, 10, 0.1f, 2.0f);
  std::vector<float> kept = logits;  // rows 0 and 2 alone
  kept.erase(kept.begin() + 3 * tc.padded, kept.end());
  kept.erase(kept.begin() + tc.padded, kept.begin() + 2 * tc.padded);
  std::vector<int32_t> kept_targets = {3, 30};
  std::vector<float> kept_dl = {dlosses[0], dlosses[2]}, kept_losses(2), losses(tc.rows);
  ops->SoftmaxCrossEntropy(View(kept, {2, tc.padded}), View(kept_targets, {2}), tc.vocab,
                           View(kept_losses, {2}), View(kept_dl, {2}));
  ops->SoftmaxCrossEntropy(View(logits, {tc.rows, tc.padded}), View(targets, {tc.rows}), tc.vocab,
                           View(losses, {tc.rows}), View(dlosses, {tc.rows}));
  EXPECT_EQ(losses, (std::vector<float>{kept_losses[0], 0.0f, kept_losses[1], 0.0f}));
  for (int64_t r : {0, 2}) {
    EXPECT_TRUE(std::equal(kept.begin() + r / 2 * tc.padded, kept.begin() + (r / 2 + 1) * tc.padded,
                           logits.begin() + r * tc.padded))
        << "row " << r;
  }
  for (int64_t r : {1, 3}) {
    for (int64_t j = 0; j < tc.padded; ++j) ASSERT_EQ(logits[r * tc.padded + j], 0.0f);
  }
}

TEST(CrossEntropyTest, RejectsOutOfRangeTargetsNamingThem) {
  auto ops = MakeCpuOps();
  std::vector<float> logits(3 * 8, 0.5f), losses(3);
  std::vector<int32_t> targets = {0, 6, 2};  // 6 is a padded column, not a real token
  ExpectErrorMentions(
      [&] {
        ops->SoftmaxCrossEntropy(View(logits, {3, 8}), View(targets, {3}), 5,
                                 View(losses, {3}), Tensor());
      },
      {"SoftmaxCrossEntropy", "target 6", "row 1", "[0, 5)"});
  targets[1] = -3;
  ExpectErrorMentions(
      [&] {
        ops->SoftmaxCrossEntropy(View(logits, {3, 8}), View(targets, {3}), 5,
                                 View(losses, {3}), Tensor());
      },
      {"target -3"});
  EXPECT_EQ(logits, std::vector<float>(3 * 8, 0.5f));
}

TEST(CrossEntropyTest, RejectsWrongShapesAndVocab) {
  auto ops = MakeCpuOps();
  std::vector<float> logits(3 * 8), losses(3), dl(2);
  std::vector<int32_t> targets(3, 0);
  ExpectErrorMentions(
      [&] {
        ops->SoftmaxCrossEntropy(View(logits, {3, 8}), View(targets, {3}), 9,
                                 View(losses, {3}), Tensor());
      },
      {"SoftmaxCrossEntropy", "vocab = 9"});
  ExpectErrorMentions(
      [&] {
        ops->SoftmaxCrossEntropy(View(logits, {3, 8}), View(targets, {3}), 8,
                                 View(losses, {3}), View(dl, {2}));
      },
      {"SoftmaxCrossEntropy", "dlosses"});
  ExpectErrorMentions(
      [&] {
        ops->SoftmaxCrossEntropy(View(logits, {3, 8}), View(losses, {3}), 8,
                                 View(losses, {3}), Tensor());
      },
      {"SoftmaxCrossEntropy", "targets", "int32"});
}

}  // namespace
}  // namespace ztrain::kernels
