// SwiGLU against a double reference written from the formula, its backward against the
// analytic derivative and finite differences, and saturation for large |gate|.
#include <cmath>
#include <vector>

#include "kernel_test_util.h"

namespace ztrain::kernels {
namespace {

using testing::ExpectClose;
using testing::ExpectErrorMentions;
using testing::Random;
using testing::View;

double Silu(double g) { return g / (1.0 + std::exp(-g)); }

std::vector<double> RefSwiGlu(const std::vector<double>& gate, const std::vector<double>& up) {
  std::vector<double> h(gate.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = Silu(gate[i]) * up[i];
  return h;
}

// Sizes below and above the parallel grain, with a ragged end; gates over [-12, 12].
TEST(SwiGluTest, ForwardMatchesReference) {
  auto ops = MakeCpuOps();
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{100003}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    auto gate = Random(n, 1, -12.0f, 12.0f), up = Random(n, 2);
    std::vector<float> h(n);
    ops->SwiGluForward(View(gate, {n}), View(up, {n}), View(h, {n}));
    ExpectClose(h, RefSwiGlu(testing::ToDouble(gate), testing::ToDouble(up)), 1e-6, "h");
  }
}

TEST(SwiGluTest, BackwardMatchesDerivativeAndFiniteDifferences) {
  auto ops = MakeCpuOps();
  const int64_t rows = 7, ch = 300;  // any shape: [rows, ch]
  const int64_t n = rows * ch;
  auto gate = Random(n, 3, -8.0f, 8.0f), up = Random(n, 4), dh = Random(n, 5);
  std::vector<float> dgate(n, 9.0f), dup(n, 9.0f);  // overwritten
  ops->SwiGluBackward(View(dh, {rows, ch}), View(gate, {rows, ch}), View(up, {rows, ch}),
                      View(dgate, {rows, ch}), View(dup, {rows, ch}));
  std::vector<double> want_dgate(n), want_dup(n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i], s = 1.0 / (1.0 + std::exp(-g));
    want_dgate[i] = dh[i] * up[i] * (s + g * s * (1.0 - s));
    want_dup[i] = dh[i] * Silu(g);
  }
  ExpectClose(dgate, want_dgate, 1e-6, "dgate");
  ExpectClose(dup, want_dup, 1e-6, "dup");
  const auto gd = testing::ToDouble(gate), ud = testing::ToDouble(up);
  testing::ExpectGradMatchesFiniteDiff(
      dgate, [&](const std::vector<double>& v) { return testing::Dot(RefSwiGlu(v, ud), dh); }, gate,
      300, 1e-5, "dgate");
  testing::ExpectGradMatchesFiniteDiff(
      dup, [&](const std::vector<double>& v) { return testing::Dot(RefSwiGlu(gd, v), dh); }, up,
      300, 1e-5, "dup");
}

// silu(g) -> g for large g and -> 0 for very negative g (e^-g overflows fp32 past 88):
// finite values and derivatives (1 and 0), never NaN.
TEST(SwiGluTest, SaturatesWithoutNaN) {
  auto ops = MakeCpuOps();
  std::vector<float> gate = {-1000.0f, -100.0f, -89.0f, 89.0f, 100.0f, 1000.0f};
  const int64_t n = static_cast<int64_t>(gate.size());
  std::vector<float> up(n, 2.0f), dh(n, 1.0f), h(n), dgate(n), dup(n);
  ops->SwiGluForward(View(gate, {n}), View(up, {n}), View(h, {n}));
  ops->SwiGluBackward(View(dh, {n}), View(gate, {n}), View(up, {n}), View(dgate, {n}),
                      View(dup, {n}));
  for (int64_t i = 0; i < n; ++i) {
    SCOPED_TRACE("gate=" + std::to_string(gate[i]));
    const bool pos = gate[i] > 0;
    EXPECT_EQ(h[i], pos ? 2.0f * gate[i] : 0.0f);
    EXPECT_EQ(dup[i], pos ? gate[i] : 0.0f);
    EXPECT_EQ(dgate[i], pos ? 2.0f : 0.0f);
  }
}

TEST(SwiGluTest, RejectsMismatchedShapes) {
  auto ops = MakeCpuOps();
  std::vector<float> a(12), b(12), c(12), d(12), e(12);
  ExpectErrorMentions(
      [&] {
        ops->SwiGluForward(View(a, {3, 4}), View(b, {4, 3}), View(c, {3, 4}));
      },
      {"SwiGluForward", "up", "[3, 4]"});
  ExpectErrorMentions(
      [&] {
        ops->SwiGluForward(View(a, {3, 4}), View(b, {3, 4}), View(c, {12}));
      },
      {"SwiGluForward", "h"});
  ExpectErrorMentions(
      [&] {
        ops->SwiGluBackward(View(a, {3, 4}), View(b, {3, 4}), View(c, {3, 4}), View(d, {3, 4}),
                            View(e, {2, 6}));
      },
      {"SwiGluBackward", "dup"});
  ExpectErrorMentions(
      [&] {
        ops->SwiGluBackward(View(a, {12}), View(b, {3, 4}), View(c, {3, 4}), View(d, {3, 4}),
                            View(e, {3, 4}));
      },
      {"SwiGluBackward", "dh"});
}

}  // namespace
}  // namespace ztrain::kernels
