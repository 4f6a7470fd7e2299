// LayerNorm against a double reference and finite differences.
#include <cmath>
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
  std::vector<double> y, mean, rstd;
};

RefNorm RefLayerNorm(const std::vector<double>& x, const std::vector<double>& w,
                     const std::vector<double>& b, int64_t rows, int64_t ch) {
  RefNorm r{std::vector<double>(rows * ch), std::vector<double>(rows),
            std::vector<double>(rows)};
  for (int64_t i = 0; i < rows; ++i) {
    double mean = 0.0, var = 0.0;
    for (int64_t c = 0; c < ch; ++c) mean += x[i * ch + c];
    mean /= ch;
    for (int64_t c = 0; c < ch; ++c) var += (x[i * ch + c] - mean) * (x[i * ch + c] - mean);
    const double rstd = 1.0 / std::sqrt(var / ch + 1e-5);
    for (int64_t c = 0; c < ch; ++c) {
      r.y[i * ch + c] = (x[i * ch + c] - mean) * rstd * w[c] + b[c];
    }
    r.mean[i] = mean;
    r.rstd[i] = rstd;
  }
  return r;
}

struct LayerNormCase {
  int64_t rows, ch;
};

TEST(LayerNormTest, ForwardMatchesReferenceAndSavesStatistics) {
  auto ops = MakeCpuOps();
  for (LayerNormCase tc : {LayerNormCase{1, 1}, {3, 7}, {6, 768}, {33, 100}}) {
    SCOPED_TRACE("rows=" + std::to_string(tc.rows) + " C=" + std::to_string(tc.ch));
    auto x = Random(tc.rows * tc.ch, 1, -2.0f, 3.0f);  // mean far from 0
    auto w = Random(tc.ch, 2), b = Random(tc.ch, 3);
    std::vector<float> y(x.size()), mean(tc.rows), rstd(tc.rows);
    ops->LayerNormForward(View(x, {tc.rows, tc.ch}), View(w, {tc.ch}), View(b, {tc.ch}),
                          View(y, {tc.rows, tc.ch}), View(mean, {tc.rows}),
                          View(rstd, {tc.rows}));
    const RefNorm ref = RefLayerNorm(testing::ToDouble(x), testing::ToDouble(w),
                                     testing::ToDouble(b), tc.rows, tc.ch);
    ExpectClose(y, ref.y, 1e-5, "y");
    ExpectClose(mean, ref.mean, 1e-5, "mean");
    ExpectClose(rstd, ref.rstd, 1e-5, "rstd");
  }
}

TEST(LayerNormTest, BackwardMatchesFiniteDifferences) {
  auto ops = MakeCpuOps();
  for (LayerNormCase tc : {LayerNormCase{1, 3}, {5, 70}, {4, 768}}) {
    SCOPED_TRACE("rows=" + std::to_string(tc.rows) + " C=" + std::to_string(tc.ch));
    const int64_t n = tc.rows * tc.ch;
    auto x = Random(n, 4, -1.0f, 2.0f), w = Random(tc.ch, 5), b = Random(tc.ch, 6);
    auto dy = Random(n, 7);
    std::vector<float> y(n), mean(tc.rows), rstd(tc.rows);
    const Tensor xt = View(x, {tc.rows, tc.ch}), wt = View(w, {tc.ch}), bt = View(b, {tc.ch});
    ops->LayerNormForward(xt, wt, bt, View(y, {tc.rows, tc.ch}), View(mean, {tc.rows}),
                          View(rstd, {tc.rows}));
    std::vector<float> dx(n, 42.0f), dw(tc.ch, 0.0f), db(tc.ch, 0.0f);
    ops->LayerNormBackward(View(dy, {tc.rows, tc.ch}), xt, wt, View(mean, {tc.rows}),
                           View(rstd, {tc.rows}), View(dx, {tc.rows, tc.ch}),
                           View(dw, {tc.ch}), View(db, {tc.ch}));
    const auto xd = testing::ToDouble(x), wd = testing::ToDouble(w), bd = testing::ToDouble(b);
    auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv,
                    const std::vector<double>& bv) {
      return testing::Dot(RefLayerNorm(xv, wv, bv, tc.rows, tc.ch).y, dy);
    };
    testing::ExpectGradMatchesFiniteDiff(
        dx, [&](const std::vector<double>& v) { return loss(v, wd, bd); }, x, 300, 1e-4, "dx");
    testing::ExpectGradMatchesFiniteDiff(
        dw, [&](const std::vector<double>& v) { return loss(xd, v, bd); }, w, 300, 1e-4, "dw");
    testing::ExpectGradMatchesFiniteDiff(
        db, [&](const std::vector<double>& v) { return loss(xd, wd, v); }, b, 300, 1e-4, "db");
  }
}

TEST(LayerNormTest, BackwardAccumulatesParameterGrads) {
  auto ops = MakeCpuOps();
  const int64_t rows = 9, ch = 150;
  auto x = Random(rows * ch, 8), w = Random(ch, 9), b = Random(ch, 10), dy = Random(rows * ch, 11);
  std::vector<float> y(rows * ch), mean(rows), rstd(rows), dx(rows * ch);
  ops->LayerNormForward(View(x, {rows, ch}), View(w, {ch}), View(b, {ch}), View(y, {rows, ch}),
                        View(mean, {rows}), View(rstd, {rows}));
  std::vector<float> dw(ch, 0.0f), db(ch, 0.0f);
  auto backward = [&] {
    ops->LayerNormBackward(View(dy, {rows, ch}), View(x, {rows, ch}), View(w, {ch}),
                           View(mean, {rows}), View(rstd, {rows}), View(dx, {rows, ch}),
                           View(dw, {ch}), View(db, {ch}));
  };
  backward();
  const std::vector<float> dw1 = dw, db1 = db, dx1 = dx;
  backward();
  std::vector<double> w2(ch), b2(ch);
  for (int64_t c = 0; c < ch; ++c) {
    w2[c] = 2.0 * dw1[c];
    b2[c] = 2.0 * db1[c];
  }
  ExpectClose(dw, w2, 1e-6, "dweight after two calls");
  ExpectClose(db, b2, 1e-6, "dbias after two calls");
  EXPECT_EQ(dx, dx1) << "dx is overwritten, not accumulated";
}

// Note [Frozen parameters]: dweight, dbias or both undefined; dx and the other gradient come
// out bit for bit (in parallel: rows * C is past the one-thread grain).
TEST(LayerNormTest, BackwardSkipsFrozenParameterGrads) {
  using testing::ArgSpec;
  using testing::Role;
  auto ops = MakeCpuOps();
  const int64_t rows = 256, ch = 150;
  testing::ExpectFrozenGradsSkippedEverywhere(
      *ops,
      {{"dy", Role::kAct, {rows, ch}},
       {"x", Role::kAct, {rows, ch}},
       {"weight", Role::kParam, {ch}},
       {"mean", Role::kStat, {rows}},
       {"rstd", Role::kStat, {rows}},
       {"dx", Role::kOut, {rows, ch}},
       {"dweight", Role::kGrad, {ch}},
       {"dbias", Role::kGrad, {ch}}},
      {{"dweight"}, {"dbias"}, {"dweight", "dbias"}}, [](Ops& o, const auto& v) {
        o.LayerNormBackward(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
      });
}

TEST(LayerNormTest, RejectsWrongShapes) {
  auto ops = MakeCpuOps();
  std::vector<float> x(12), w(4), b(3), y(12), stat(3);
  ExpectErrorMentions([&] { ops->LayerNormForward(View(x, {3, 4}), View(w, {4}), View(b, {3}),
                                                  View(y, {3, 4}), View(stat, {3}),
                                                  View(stat, {3})); },
                      {"LayerNormForward", "bias"});
  ExpectErrorMentions([&] { ops->LayerNormForward(View(x, {4, 3}), View(w, {4}), View(w, {4}),
                                                  View(y, {4, 3}), View(stat, {3}),
                                                  View(stat, {3})); },
                      {"LayerNormForward", "x"});
  ExpectErrorMentions([&] { ops->LayerNormForward(View(x, {2, 6}), View(w, {4}), View(w, {4}),
                                                  View(y, {2, 6}), View(stat, {3}),
                                                  View(stat, {3})); },
                      {"LayerNormForward", "x"});
  std::vector<float> w6(6);
  ExpectErrorMentions([&] { ops->LayerNormForward(View(x, {2, 6}), View(w6, {6}),
                                                  View(w6, {6}), View(y, {2, 6}),
                                                  View(stat, {3}), View(stat, {3})); },
                      {"LayerNormForward", "mean", "2 elements"});
}

}  // namespace
}  // namespace ztrain::kernels
