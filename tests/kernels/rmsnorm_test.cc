// RMSNorm against a double reference written from the formula, its backward against finite
// differences of that reference, and the place of eps (inside the square root).
#include <cmath>
#include <string>
#include <vector>

#include "frozen_test_util.h"
#include "kernel_test_util.h"

namespace ztrain::kernels {
namespace {

using testing::ExpectClose;
using testing::ExpectErrorMentions;
using testing::Random;
using testing::View;

struct RefNorm {
  std::vector<double> y, rstd;
};

// y = x / sqrt(mean(x^2) + eps) * w, row by row.
RefNorm RefRmsNorm(const std::vector<double>& x, const std::vector<double>& w, double eps,
                   int64_t rows, int64_t ch) {
  RefNorm r{std::vector<double>(rows * ch), std::vector<double>(rows)};
  for (int64_t i = 0; i < rows; ++i) {
    double sum_sq = 0.0;
    for (int64_t c = 0; c < ch; ++c) sum_sq += x[i * ch + c] * x[i * ch + c];
    r.rstd[i] = 1.0 / std::sqrt(sum_sq / ch + eps);
    for (int64_t c = 0; c < ch; ++c) r.y[i * ch + c] = x[i * ch + c] * r.rstd[i] * w[c];
  }
  return r;
}

struct RmsCase {
  int64_t rows, ch;
  float eps;
  std::string Name() const {
    return "rows=" + std::to_string(rows) + " C=" + std::to_string(ch) +
           " eps=" + std::to_string(eps);
  }
};

// Single rows, ragged widths around the 64-channel blocks of the dweight sum, Llama's widths
// and epsilons; enough rows * C to run on several threads.
const RmsCase kCases[] = {
    {1, 1, 1e-5f}, {3, 7, 1e-6f}, {6, 768, 1e-5f}, {33, 100, 1e-6f}, {70, 520, 1e-5f}};

TEST(RmsNormTest, ForwardMatchesReferenceAndSavesRstd) {
  auto ops = MakeCpuOps();
  for (const RmsCase& tc : kCases) {
    SCOPED_TRACE(tc.Name());
    auto x = Random(tc.rows * tc.ch, 1, -2.0f, 3.0f), w = Random(tc.ch, 2);
    std::vector<float> y(x.size()), rstd(tc.rows);
    ops->RmsNormForward(View(x, {tc.rows, tc.ch}), View(w, {tc.ch}), tc.eps,
                        View(y, {tc.rows, tc.ch}), View(rstd, {tc.rows}));
    const RefNorm ref =
        RefRmsNorm(testing::ToDouble(x), testing::ToDouble(w), tc.eps, tc.rows, tc.ch);
    ExpectClose(y, ref.y, 1e-5, "y");
    ExpectClose(rstd, ref.rstd, 1e-5, "rstd");
  }
}

// Rows of mean square 1e-6 with eps = 1e-4: eps dominates. Inside the square root rstd is
// ~99.5; eps added outside it (1 / (rms + eps), a common slip) would give ~909, and no eps
// 1000. A [B, T, C] x takes rows over its leading dimensions.
TEST(RmsNormTest, EpsSitsInsideTheSquareRoot) {
  auto ops = MakeCpuOps();
  const int64_t rows = 6, ch = 64;
  const float eps = 1e-4f;
  auto x = Random(rows * ch, 3, -1.0f, 1.0f);
  for (float& v : x) v = (v < 0 ? -1e-3f : 1e-3f);  // mean square exactly 1e-6 (to rounding)
  std::vector<float> w(ch, 1.0f), y(x.size()), rstd(rows);
  ops->RmsNormForward(View(x, {2, 3, ch}), View(w, {ch}), eps, View(y, {2, 3, ch}),
                      View(rstd, {2, 3}));
  const RefNorm ref = RefRmsNorm(testing::ToDouble(x), testing::ToDouble(w), eps, rows, ch);
  ExpectClose(rstd, ref.rstd, 1e-5, "rstd");
  ExpectClose(y, ref.y, 1e-5, "y");
  EXPECT_NEAR(rstd[0], 1.0 / std::sqrt(1e-6 + 1e-4), 1e-3);
}

TEST(RmsNormTest, BackwardMatchesFiniteDifferences) {
  auto ops = MakeCpuOps();
  for (const RmsCase& tc : {RmsCase{1, 3, 1e-5f},
                            {5, 70, 1e-6f},
                            {4, 768, 1e-5f},
                            {3, 16, 0.3f}}) {  // and one where eps is a large part of rstd
    SCOPED_TRACE(tc.Name());
    const int64_t n = tc.rows * tc.ch;
    auto x = Random(n, 4, -1.0f, 2.0f), w = Random(tc.ch, 5), dy = Random(n, 6);
    std::vector<float> y(n), rstd(tc.rows);
    const Tensor xt = View(x, {tc.rows, tc.ch}), wt = View(w, {tc.ch});
    ops->RmsNormForward(xt, wt, tc.eps, View(y, {tc.rows, tc.ch}), View(rstd, {tc.rows}));
    std::vector<float> dx(n, 42.0f), dw(tc.ch, 0.0f);  // dx overwritten, dw accumulated
    ops->RmsNormBackward(View(dy, {tc.rows, tc.ch}), xt, wt, View(rstd, {tc.rows}),
                         View(dx, {tc.rows, tc.ch}), View(dw, {tc.ch}));
    const auto xd = testing::ToDouble(x), wd = testing::ToDouble(w);
    auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv) {
      return testing::Dot(RefRmsNorm(xv, wv, tc.eps, tc.rows, tc.ch).y, dy);
    };
    testing::ExpectGradMatchesFiniteDiff(
        dx, [&](const std::vector<double>& v) { return loss(v, wd); }, x, 300, 1e-4, "dx");
    testing::ExpectGradMatchesFiniteDiff(
        dw, [&](const std::vector<double>& v) { return loss(xd, v); }, w, 300, 1e-4, "dw");
  }
}

TEST(RmsNormTest, BackwardAccumulatesDweightAndOverwritesDx) {
  auto ops = MakeCpuOps();
  const int64_t rows = 9, ch = 150;
  auto x = Random(rows * ch, 8), w = Random(ch, 9), dy = Random(rows * ch, 11);
  std::vector<float> y(rows * ch), rstd(rows), dx(rows * ch);
  ops->RmsNormForward(View(x, {rows, ch}), View(w, {ch}), 1e-5f, View(y, {rows, ch}),
                      View(rstd, {rows}));
  std::vector<float> dw(ch, 0.0f);
  auto backward = [&] {
    ops->RmsNormBackward(View(dy, {rows, ch}), View(x, {rows, ch}), View(w, {ch}),
                         View(rstd, {rows}), View(dx, {rows, ch}), View(dw, {ch}));
  };
  backward();
  const std::vector<float> dw1 = dw, dx1 = dx;
  backward();
  std::vector<double> w2(ch);
  for (int64_t c = 0; c < ch; ++c) w2[c] = 2.0 * dw1[c];
  ExpectClose(dw, w2, 1e-6, "dweight after two calls");
  EXPECT_EQ(dx, dx1) << "dx is overwritten, not accumulated";
}

// Note [Frozen parameters]: an undefined dweight; dx comes out bit for bit (in parallel too).
TEST(RmsNormTest, BackwardSkipsAFrozenWeightGrad) {
  using testing::ArgSpec;
  using testing::Role;
  auto ops = MakeCpuOps();
  for (const int64_t rows : {int64_t{9}, int64_t{256}}) {  // one thread, and several
    const int64_t ch = 150;
    testing::ExpectFrozenGradsSkippedEverywhere(
        *ops,
        {{"dy", Role::kAct, {rows, ch}},
         {"x", Role::kAct, {rows, ch}},
         {"weight", Role::kParam, {ch}},
         {"rstd", Role::kStat, {rows}},
         {"dx", Role::kOut, {rows, ch}},
         {"dweight", Role::kGrad, {ch}}},
        {{"dweight"}},
        [](Ops& o, const auto& v) { o.RmsNormBackward(v[0], v[1], v[2], v[3], v[4], v[5]); });
  }
}

TEST(RmsNormTest, RejectsWrongShapesAndEps) {
  auto ops = MakeCpuOps();
  std::vector<float> x(12), w(4), y(12), stat(3), w3(3);
  ExpectErrorMentions(
      [&] {
        ops->RmsNormForward(View(x, {4, 3}), View(w, {4}), 1e-5f, View(y, {4, 3}), View(stat, {3}));
      },
      {"RmsNormForward", "x", "[..., 4]"});
  ExpectErrorMentions(
      [&] {
        ops->RmsNormForward(View(x, {3, 4}), View(w, {4}), 1e-5f, View(y, {4, 3}), View(stat, {3}));
      },
      {"RmsNormForward", "y"});
  ExpectErrorMentions(
      [&] {
        ops->RmsNormForward(View(x, {2, 6}), View(w3, {3}), 1e-5f, View(y, {2, 6}),
                            View(stat, {3}));
      },
      {"RmsNormForward", "x"});
  ExpectErrorMentions(
      [&] {
        ops->RmsNormForward(View(x, {3, 4}), View(w, {4}), -1.0f, View(y, {3, 4}), View(stat, {3}));
      },
      {"RmsNormForward", "eps"});
  ExpectErrorMentions(
      [&] {
        ops->RmsNormForward(View(x, {3, 4}), View(x, {3, 4}), 1e-5f, View(y, {3, 4}),
                            View(stat, {3}));
      },
      {"RmsNormForward", "weight"});
  std::vector<float> stat4(4);
  ExpectErrorMentions(
      [&] {
        ops->RmsNormBackward(View(x, {3, 4}), View(x, {3, 4}), View(w, {4}), View(stat4, {4}),
                             View(y, {3, 4}), View(w, {4}));
      },
      {"RmsNormBackward", "rstd", "3 elements"});
  ExpectErrorMentions(
      [&] {
        ops->RmsNormBackward(View(x, {3, 4}), View(x, {3, 4}), View(w, {4}), View(stat, {3}),
                             View(y, {3, 4}), View(w3, {3}));
      },
      {"RmsNormBackward", "dweight"});
}

}  // namespace
}  // namespace ztrain::kernels
