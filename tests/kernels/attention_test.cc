// Causal attention against a naive double reference that materialises the full T x T
// matrix, and its backward against an analytic double reference and finite differences.
#include <cmath>
#include <vector>

#include "kernel_test_util.h"

namespace ztrain::kernels {
namespace {

using testing::ExpectClose;
using testing::ExpectErrorMentions;
using testing::Random;
using testing::View;

struct AttnCase {
  int64_t batch, seq, ch;
  int heads;
  std::string Name() const {
    return "B=" + std::to_string(batch) + " T=" + std::to_string(seq) +
           " C=" + std::to_string(ch) + " NH=" + std::to_string(heads);
  }
};

// Softmax probabilities P[i][j] (j <= i) of one (b, h) in double, row-major T x T.
std::vector<double> RefProbs(const std::vector<double>& qkv, const AttnCase& tc, int64_t b,
                             int64_t h, std::vector<double>* lse) {
  const int64_t hs = tc.ch / tc.heads, stride = 3 * tc.ch, T = tc.seq;
  const double* q = qkv.data() + b * T * stride + h * hs;
  const double* k = q + tc.ch;
  std::vector<double> p(T * T, 0.0);
  for (int64_t i = 0; i < T; ++i) {
    double mx = -INFINITY;
    for (int64_t j = 0; j <= i; ++j) {
      double s = 0.0;
      for (int64_t d = 0; d < hs; ++d) s += q[i * stride + d] * k[j * stride + d];
      p[i * T + j] = s / std::sqrt(double(hs));
      mx = std::max(mx, p[i * T + j]);
    }
    double sum = 0.0;
    for (int64_t j = 0; j <= i; ++j) sum += std::exp(p[i * T + j] - mx);
    for (int64_t j = 0; j <= i; ++j) p[i * T + j] = std::exp(p[i * T + j] - mx) / sum;
    if (lse) (*lse)[(b * tc.heads + h) * T + i] = mx + std::log(sum);
  }
  return p;
}

std::vector<double> RefForward(const std::vector<double>& qkv, const AttnCase& tc,
                               std::vector<double>* lse) {
  const int64_t hs = tc.ch / tc.heads, stride = 3 * tc.ch, T = tc.seq;
  std::vector<double> out(tc.batch * T * tc.ch, 0.0);
  for (int64_t b = 0; b < tc.batch; ++b) {
    for (int64_t h = 0; h < tc.heads; ++h) {
      const std::vector<double> p = RefProbs(qkv, tc, b, h, lse);
      const double* v = qkv.data() + b * T * stride + 2 * tc.ch + h * hs;
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t d = 0; d < hs; ++d) {
            out[(b * T + i) * tc.ch + h * hs + d] += p[i * T + j] * v[j * stride + d];
          }
        }
      }
    }
  }
  return out;
}

// dqkv from dout by the textbook formulas on the full P matrix.
std::vector<double> RefBackward(const std::vector<double>& qkv, const std::vector<float>& dout,
                                const AttnCase& tc) {
  const int64_t hs = tc.ch / tc.heads, stride = 3 * tc.ch, T = tc.seq;
  const double scale = 1.0 / std::sqrt(double(hs));
  std::vector<double> dqkv(qkv.size(), 0.0);
  for (int64_t b = 0; b < tc.batch; ++b) {
    for (int64_t h = 0; h < tc.heads; ++h) {
      const std::vector<double> p = RefProbs(qkv, tc, b, h, nullptr);
      const int64_t base = b * T * stride + h * hs;
      auto q = [&](int64_t t, int64_t d) { return qkv[base + t * stride + d]; };
      auto k = [&](int64_t t, int64_t d) { return qkv[base + tc.ch + t * stride + d]; };
      auto v = [&](int64_t t, int64_t d) { return qkv[base + 2 * tc.ch + t * stride + d]; };
      auto g = [&](int64_t t, int64_t d) { return double{dout[(b * T + t) * tc.ch + h * hs + d]}; };
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> dp(i + 1);
        double row = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t d = 0; d < hs; ++d) dp[j] += g(i, d) * v(j, d);
          row += p[i * T + j] * dp[j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[i * T + j] * (dp[j] - row) * scale;
          for (int64_t d = 0; d < hs; ++d) {
            dqkv[base + i * stride + d] += ds * k(j, d);
            dqkv[base + tc.ch + j * stride + d] += ds * q(i, d);
            dqkv[base + 2 * tc.ch + j * stride + d] += p[i * T + j] * g(i, d);
          }
        }
      }
    }
  }
  return dqkv;
}

// Awkward T around the 64-row tile; head sizes 4..128 (multiples of 64 take the
// register-blocked path of AccumulateWeightedRows, the others the plain loop).
const AttnCase kCases[] = {{1, 1, 8, 1},    {2, 7, 12, 3},  {1, 64, 32, 2},
                           {1, 65, 16, 4},  {1, 67, 16, 2}, {2, 130, 24, 3},
                           {1, 130, 128, 2}, {1, 70, 128, 1}};

TEST(AttentionTest, ForwardMatchesNaiveReference) {
  auto ops = MakeCpuOps();
  for (const AttnCase& tc : kCases) {
    SCOPED_TRACE(tc.Name());
    auto qkv = Random(tc.batch * tc.seq * 3 * tc.ch, 1);
    std::vector<float> out(tc.batch * tc.seq * tc.ch), lse(tc.batch * tc.heads * tc.seq);
    ops->AttentionForward(View(qkv, {tc.batch, tc.seq, 3 * tc.ch}), tc.heads,
                          View(out, {tc.batch, tc.seq, tc.ch}),
                          View(lse, {tc.batch, tc.heads, tc.seq}));
    std::vector<double> ref_lse(lse.size());
    ExpectClose(out, RefForward(testing::ToDouble(qkv), tc, &ref_lse), 1e-5, "out");
    ExpectClose(lse, ref_lse, 1e-5, "lse");
  }
}

TEST(AttentionTest, ForwardIsStableForLargeScores) {
  auto ops = MakeCpuOps();
  const AttnCase tc{1, 70, 16, 2};
  // Scores up to ~400: fp32 rounding of a score moves its probability by ~|score| * 6e-8,
  // so this ill-conditioned case gets a looser tolerance; what it checks is no overflow.
  auto qkv = Random(tc.seq * 3 * tc.ch, 2, -12.0f, 12.0f);
  std::vector<float> out(tc.seq * tc.ch), lse(tc.heads * tc.seq);
  ops->AttentionForward(View(qkv, {1, tc.seq, 3 * tc.ch}), tc.heads, View(out, {1, tc.seq, tc.ch}),
                        View(lse, {1, tc.heads, tc.seq}));
  std::vector<double> ref_lse(lse.size());
  ExpectClose(out, RefForward(testing::ToDouble(qkv), tc, &ref_lse), 1e-4, "out");
  ExpectClose(lse, ref_lse, 1e-5, "lse");
}

TEST(AttentionTest, BackwardMatchesAnalyticReference) {
  auto ops = MakeCpuOps();
  for (const AttnCase& tc : kCases) {
    SCOPED_TRACE(tc.Name());
    auto qkv = Random(tc.batch * tc.seq * 3 * tc.ch, 3);
    auto dout = Random(tc.batch * tc.seq * tc.ch, 4);
    std::vector<float> out(dout.size()), lse(tc.batch * tc.heads * tc.seq);
    std::vector<float> dqkv(qkv.size(), 77.0f);  // must be overwritten
    const Tensor qkv_t = View(qkv, {tc.batch, tc.seq, 3 * tc.ch});
    const Tensor out_t = View(out, {tc.batch, tc.seq, tc.ch});
    const Tensor lse_t = View(lse, {tc.batch, tc.heads, tc.seq});
    ops->AttentionForward(qkv_t, tc.heads, out_t, lse_t);
    ops->AttentionBackward(View(dout, {tc.batch, tc.seq, tc.ch}), qkv_t, out_t, lse_t, tc.heads,
                           View(dqkv, {tc.batch, tc.seq, 3 * tc.ch}));
    ExpectClose(dqkv, RefBackward(testing::ToDouble(qkv), dout, tc), 1e-5, "dqkv");
  }
}

TEST(AttentionTest, BackwardMatchesFiniteDifferences) {
  auto ops = MakeCpuOps();
  // The small case is checked at every element, the one spanning two tiles at a sample.
  for (const AttnCase& tc : {AttnCase{2, 7, 12, 3}, AttnCase{1, 67, 16, 2}}) {
    SCOPED_TRACE(tc.Name());
    auto qkv = Random(tc.batch * tc.seq * 3 * tc.ch, 5);
    auto dout = Random(tc.batch * tc.seq * tc.ch, 6);
    std::vector<float> out(dout.size()), lse(tc.batch * tc.heads * tc.seq), dqkv(qkv.size());
    const Tensor qkv_t = View(qkv, {tc.batch, tc.seq, 3 * tc.ch});
    const Tensor out_t = View(out, {tc.batch, tc.seq, tc.ch});
    const Tensor lse_t = View(lse, {tc.batch, tc.heads, tc.seq});
    ops->AttentionForward(qkv_t, tc.heads, out_t, lse_t);
    ops->AttentionBackward(View(dout, {tc.batch, tc.seq, tc.ch}), qkv_t, out_t, lse_t, tc.heads,
                           View(dqkv, {tc.batch, tc.seq, 3 * tc.ch}));
    testing::ExpectGradMatchesFiniteDiff(
        dqkv, [&](const std::vector<double>& v) { return testing::Dot(RefForward(v, tc, nullptr), dout); },
        qkv, 600, 1e-4, "dqkv");
  }
}

TEST(AttentionTest, RejectsBadHeadsAndShapes) {
  auto ops = MakeCpuOps();
  std::vector<float> qkv(2 * 3 * 12), out(2 * 12), lse(2 * 5), dqkv(qkv.size());
  const Tensor qkv_t = View(qkv, {1, 2, 36}), out_t = View(out, {1, 2, 12});
  ExpectErrorMentions([&] { ops->AttentionForward(qkv_t, 5, out_t, View(lse, {1, 5, 2})); },
                      {"AttentionForward", "num_heads = 5", "C = 12"});
  ExpectErrorMentions([&] { ops->AttentionForward(qkv_t, 0, out_t, View(lse, {1, 5, 2})); },
                      {"AttentionForward", "num_heads"});
  ExpectErrorMentions([&] { ops->AttentionForward(qkv_t, 3, out_t, View(lse, {1, 2, 5})); },
                      {"AttentionForward", "lse", "[1, 3, 2]"});
  ExpectErrorMentions([&] { ops->AttentionForward(View(qkv, {1, 3, 24}), 2, out_t,
                                                  View(lse, {1, 2, 5})); },
                      {"AttentionForward", "out"});
  std::vector<float> lse6(6);
  ExpectErrorMentions([&] { ops->AttentionBackward(View(out, {2, 12}), qkv_t, out_t,
                                                   View(lse6, {1, 3, 2}), 3,
                                                   View(dqkv, {1, 2, 36})); },
                      {"AttentionBackward", "dout"});
}

}  // namespace
}  // namespace ztrain::kernels
