// Rotary position embedding (rotate-half) against a double reference written from ops.h's
// formula, its backward against finite differences, and what the positions and heads are.
#include <cmath>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace ztrain::kernels {
namespace {

using testing::ExpectClose;
using testing::ExpectErrorMentions;
using testing::Random;
using testing::View;

struct RopeCase {
  int64_t batch, seq;
  int heads, kv_heads, head_dim;
  AttentionHeads Heads() const { return {heads, kv_heads, head_dim}; }
  int64_t width() const { return Heads().qkv_width(); }
  int64_t rotated() const { return int64_t{heads + kv_heads} * head_dim; }  // q and k columns
  int64_t numel() const { return batch * seq * width(); }
  Shape shape() const { return {batch, seq, width()}; }
  std::string Name() const {
    return "B=" + std::to_string(batch) + " T=" + std::to_string(seq) +
           " NH=" + std::to_string(heads) + " NKV=" + std::to_string(kv_heads) +
           " HS=" + std::to_string(head_dim);
  }
};

// Llama's inverse frequencies, theta^(-2i / HS) with theta = 10000.
std::vector<float> InvFreq(int head_dim) {
  std::vector<float> f(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i)
    f[i] = static_cast<float>(std::pow(1e4, -2.0 * i / head_dim));
  return f;
}

// ops.h's rotation in double on the q and k heads, v copied: x'[i] = x[i] cos a - x[i+H] sin a,
// x'[i+H] = x[i+H] cos a + x[i] sin a, H = HS/2, a = t * inv_freq[i]. The angle is the fp32
// product, as the contract fixes it (at t ~ 300 its rounding moves cos by ~1e-5, so a double
// angle would be a different function); cos and sin in double.
std::vector<double> RefRope(const std::vector<double>& x, const RopeCase& tc,
                            const std::vector<float>& inv_freq) {
  std::vector<double> y = x;
  const int64_t half = tc.head_dim / 2;
  for (int64_t b = 0; b < tc.batch; ++b) {
    for (int64_t t = 0; t < tc.seq; ++t) {
      const int64_t row = (b * tc.seq + t) * tc.width();
      for (int64_t h0 = 0; h0 < tc.rotated(); h0 += tc.head_dim) {
        for (int64_t i = 0; i < half; ++i) {
          const double a = static_cast<float>(t) * inv_freq[i];  // fp32 product
          const double lo = x[row + h0 + i], hi = x[row + h0 + half + i];
          y[row + h0 + i] = lo * std::cos(a) - hi * std::sin(a);
          y[row + h0 + half + i] = hi * std::cos(a) + lo * std::sin(a);
        }
      }
    }
  }
  return y;
}

// v columns of every row of qkv, for bit-for-bit comparisons.
std::vector<float> VColumns(const std::vector<float>& qkv, const RopeCase& tc) {
  std::vector<float> v;
  for (int64_t r = 0; r < tc.batch * tc.seq; ++r) {
    v.insert(v.end(), qkv.begin() + r * tc.width() + tc.rotated(),
             qkv.begin() + (r + 1) * tc.width());
  }
  return v;
}

// Small heads, groups and multi-query, an odd number of positions, and one large enough to
// run on several threads with angles up to ~300 radians.
const RopeCase kCases[] = {
    {2, 5, 2, 2, 8}, {1, 70, 4, 2, 16}, {2, 33, 3, 1, 6}, {1, 300, 8, 2, 128}, {3, 4, 1, 1, 2}};

TEST(RopeTest, ForwardMatchesReferenceAndLeavesVAlone) {
  auto ops = MakeCpuOps();
  for (const RopeCase& tc : kCases) {
    SCOPED_TRACE(tc.Name());
    auto qkv = Random(tc.numel(), 1, -2.0f, 2.0f), inv_freq = InvFreq(tc.head_dim);
    const std::vector<float> before = qkv;
    ops->RopeForward(View(qkv, tc.shape()), tc.Heads(), View(inv_freq, {tc.head_dim / 2}));
    ExpectClose(qkv, RefRope(testing::ToDouble(before), tc, inv_freq), 1e-6, "qkv");
    EXPECT_EQ(VColumns(qkv, tc), VColumns(before, tc)) << "v must be left alone";
  }
}

// Positions count within each sequence: every batch row's t = 0 stays as it is (angle 0), and
// a unit vector in element 0 of a head at position t turns to (cos, sin) of t * inv_freq[0]
// in elements 0 and HS/2, for every q and k head.
TEST(RopeTest, RowTTurnsByTTimesInvFreq) {
  auto ops = MakeCpuOps();
  const RopeCase tc{3, 50, 2, 1, 4};
  std::vector<float> inv_freq = {0.37f, 0.0f};  // the second pair never turns
  std::vector<float> qkv = Random(tc.numel(), 2);
  for (int64_t r = 0; r < tc.batch * tc.seq; ++r) {
    if (r % tc.seq == 0) continue;
    for (int64_t h0 = 0; h0 < tc.rotated(); h0 += tc.head_dim) {
      float* head = qkv.data() + r * tc.width() + h0;
      head[0] = 1.0f, head[1] = 0.25f, head[2] = 0.0f, head[3] = -0.5f;
    }
  }
  const std::vector<float> before = qkv;
  ops->RopeForward(View(qkv, tc.shape()), tc.Heads(), View(inv_freq, {2}));
  for (int64_t b = 0; b < tc.batch; ++b) {
    for (int64_t t = 0; t < tc.seq; ++t) {
      const int64_t r = b * tc.seq + t;
      SCOPED_TRACE("b=" + std::to_string(b) + " t=" + std::to_string(t));
      for (int64_t h0 = 0; h0 < tc.rotated(); h0 += tc.head_dim) {
        const float* got = qkv.data() + r * tc.width() + h0;
        const float* was = before.data() + r * tc.width() + h0;
        if (t == 0) {
          for (int i = 0; i < 4; ++i) ASSERT_EQ(got[i], was[i]) << "t = 0 does not turn";
          continue;
        }
        const double a = static_cast<float>(t) * 0.37f;
        EXPECT_NEAR(got[0], std::cos(a), 2e-7);
        EXPECT_NEAR(got[2], std::sin(a), 2e-7);
        EXPECT_EQ(got[1], 0.25f) << "inv_freq 0 leaves its pair alone";
        EXPECT_EQ(got[3], -0.5f);
      }
    }
  }
}

// Packed documents: row (b, t) turns by positions[b][t], bit for bit what a one-row call at
// first_position = positions[b][t] gives, forward and backward (and v is left alone).
TEST(RopeTest, PerTokenPositionsTurnEachRowByItsOwn) {
  auto ops = MakeCpuOps();
  const RopeCase tc{2, 9, 4, 2, 8};
  std::vector<float> inv_freq = Random(tc.head_dim / 2, 3, 0.01f, 1.0f);
  std::vector<int32_t> positions = {0, 1, 2, 0, 1, 0, 1, 2, 3,  //
                                    5, 6, 7, 8, 0, 1, 2, 3, 4};
  for (bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "backward" : "forward");
    std::vector<float> qkv = Random(tc.numel(), 4);
    std::vector<float> want = qkv;
    for (int64_t r = 0; r < tc.batch * tc.seq; ++r) {
      std::vector<float> row(want.begin() + r * tc.width(), want.begin() + (r + 1) * tc.width());
      if (backward) {  // a sequence of positions 0 .. p whose last row is this one
        const int64_t p = positions[r];
        std::vector<float> seq((p + 1) * tc.width(), 0.0f);
        std::copy(row.begin(), row.end(), seq.begin() + p * tc.width());
        ops->RopeBackward(View(seq, {1, p + 1, tc.width()}), tc.Heads(), View(inv_freq, {4}),
                          0.75f);
        std::copy(seq.begin() + p * tc.width(), seq.end(), row.begin());
      } else {
        ops->RopeForward(View(row, {1, 1, tc.width()}), tc.Heads(), View(inv_freq, {4}),
                         positions[r], 0.75f);
      }
      std::copy(row.begin(), row.end(), want.begin() + r * tc.width());
    }
    if (backward) {
      ops->RopeBackward(View(qkv, tc.shape()), tc.Heads(), View(inv_freq, {4}), 0.75f,
                        View(positions, {tc.batch, tc.seq}));
    } else {
      ops->RopeForward(View(qkv, tc.shape()), tc.Heads(), View(inv_freq, {4}), 0, 0.75f,
                       View(positions, {tc.batch, tc.seq}));
    }
    EXPECT_EQ(qkv, want);
  }
  std::vector<float> qkv = Random(tc.numel(), 5);
  ExpectErrorMentions(
      [&] {
        ops->RopeForward(View(qkv, tc.shape()), tc.Heads(), View(inv_freq, {4}), 3, 1.0f,
                         View(positions, {tc.batch, tc.seq}));
      },
      {"RopeForward", "first_position = 3", "per-token positions"});
  positions[4] = -1;
  ExpectErrorMentions(
      [&] {
        ops->RopeForward(View(qkv, tc.shape()), tc.Heads(), View(inv_freq, {4}), 0, 1.0f,
                         View(positions, {tc.batch, tc.seq}));
      },
      {"positions[0][4] = -1", "negative"});
}

TEST(RopeTest, BackwardUndoesForward) {
  auto ops = MakeCpuOps();
  for (const RopeCase& tc : kCases) {
    SCOPED_TRACE(tc.Name());
    auto qkv = Random(tc.numel(), 3, -2.0f, 2.0f), inv_freq = InvFreq(tc.head_dim);
    const std::vector<float> before = qkv;
    const Tensor t = View(qkv, tc.shape()), f = View(inv_freq, {tc.head_dim / 2});
    ops->RopeForward(t, tc.Heads(), f);
    ops->RopeBackward(t, tc.Heads(), f);
    ExpectClose(qkv, testing::ToDouble(before), 1e-6, "backward(forward(qkv))");
    EXPECT_EQ(VColumns(qkv, tc), VColumns(before, tc));
  }
}

// The gradient through the rotation (v's passes unchanged) against finite differences of
// <RefRope(qkv), dy>.
TEST(RopeTest, BackwardMatchesFiniteDifferences) {
  auto ops = MakeCpuOps();
  for (const RopeCase& tc : {RopeCase{2, 5, 2, 1, 8}, RopeCase{1, 70, 4, 2, 16}}) {
    SCOPED_TRACE(tc.Name());
    auto qkv = Random(tc.numel(), 4), dy = Random(tc.numel(), 5), inv_freq = InvFreq(tc.head_dim);
    std::vector<float> dqkv = dy;
    ops->RopeBackward(View(dqkv, tc.shape()), tc.Heads(), View(inv_freq, {tc.head_dim / 2}));
    testing::ExpectGradMatchesFiniteDiff(
        dqkv,
        [&](const std::vector<double>& v) { return testing::Dot(RefRope(v, tc, inv_freq), dy); },
        qkv, 600, 1e-5, "dqkv");
  }
}

// A scale on cos and sin (YaRN's attention factor) scales the rotated q and k and leaves v:
// the forward against the reference times the scale, the backward against finite differences
// of <scale * RefRope(qkv), dy>.
TEST(RopeTest, ScaleMultipliesCosAndSin) {
  auto ops = MakeCpuOps();
  const RopeCase tc{2, 9, 2, 1, 8};
  constexpr float kScale = 1.1386294f;  // 0.1 ln 4 + 1
  auto qkv = Random(tc.numel(), 6), inv_freq = InvFreq(tc.head_dim);
  const std::vector<float> before = qkv;
  const Tensor f = View(inv_freq, {tc.head_dim / 2});
  auto scaled_ref = [&](const std::vector<double>& x) {  // RefRope, q and k times kScale
    std::vector<double> y = RefRope(x, tc, inv_freq);
    for (int64_t r = 0; r < tc.batch * tc.seq; ++r) {
      for (int64_t c = 0; c < tc.rotated(); ++c) y[r * tc.width() + c] *= kScale;
    }
    return y;
  };
  ops->RopeForward(View(qkv, tc.shape()), tc.Heads(), f, 0, kScale);
  ExpectClose(qkv, scaled_ref(testing::ToDouble(before)), 1e-6, "scaled qkv");
  EXPECT_EQ(VColumns(qkv, tc), VColumns(before, tc));
  auto dy = Random(tc.numel(), 7);
  std::vector<float> dqkv = dy;
  ops->RopeBackward(View(dqkv, tc.shape()), tc.Heads(), f, kScale);
  testing::ExpectGradMatchesFiniteDiff(
      dqkv, [&](const std::vector<double>& v) { return testing::Dot(scaled_ref(v), dy); }, before,
      600, 1e-5, "dqkv");
}

TEST(RopeTest, RejectsBadHeadsShapesAndInvFreq) {
  auto ops = MakeCpuOps();
  // NH = 2, NKV = 1, HS = 4: qkv [1, 3, 16], inv_freq [2].
  std::vector<float> qkv(3 * 16), f2(2), f3(3);
  const Tensor qkv_t = View(qkv, {1, 3, 16}), f = View(f2, {2});
  ExpectErrorMentions(
      [&] {
        ops->RopeForward(qkv_t, {2, 1, 5}, View(f3, {3}));
      },
      {"RopeForward", "qkv", "[B, T, 20]"});
  std::vector<float> odd(3 * 20);
  ExpectErrorMentions(
      [&] {
        ops->RopeForward(View(odd, {1, 3, 20}), {2, 1, 5}, f);
      },
      {"RopeForward", "head_dim = 5", "even"});
  ExpectErrorMentions(
      [&] {
        ops->RopeForward(qkv_t, {2, 1, 4}, View(f3, {3}));
      },
      {"RopeForward", "inv_freq", "[2]"});
  ExpectErrorMentions(
      [&] {
        ops->RopeForward(qkv_t, {4, 3, 2}, f);
      },
      {"RopeForward", "num_kv_heads = 3"});
  ExpectErrorMentions(
      [&] {
        ops->RopeBackward(View(qkv, {3, 16}), {2, 1, 4}, f);
      },
      {"RopeBackward", "dqkv"});
  std::vector<uint16_t> half(2);
  ExpectErrorMentions(
      [&] {
        ops->RopeBackward(qkv_t, {2, 1, 4}, Tensor(half.data(), DType::kBF16, {2}));
      },
      {"RopeBackward", "inv_freq", "bf16", "fp32"});
  EXPECT_EQ(qkv, std::vector<float>(3 * 16, 0.0f)) << "nothing is written before the checks";
}

}  // namespace
}  // namespace ztrain::kernels
