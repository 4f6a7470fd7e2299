// GELU (tanh approximation) against the formula in double, and its derivative.
#include <cmath>
#include <vector>

#include "kernel_test_util.h"

namespace ztrain::kernels {
namespace {

using testing::ExpectClose;
using testing::Random;
using testing::View;

double RefGelu(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}

TEST(GeluTest, ForwardMatchesTanhFormula) {
  auto ops = MakeCpuOps();
  auto x = Random(100003, 1, -8.0f, 8.0f);  // not a multiple of the vector width
  x[0] = 0.0f;
  x[1] = -1e-3f;
  std::vector<float> y(x.size());
  ops->GeluForward(View(x, {int64_t(x.size())}), View(y, {int64_t(y.size())}));
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = RefGelu(x[i]);
  ExpectClose(y, want, 1e-5, "gelu");
}

TEST(GeluTest, ExtremeInputsStayFinite) {
  auto ops = MakeCpuOps();
  std::vector<float> x = {-1e4f, -60.0f, -10.0f, 10.0f, 60.0f, 1e4f}, y(6), dx(6);
  std::vector<float> ones(6, 1.0f);
  ops->GeluForward(View(x, {2, 3}), View(y, {2, 3}));
  ops->GeluBackward(View(ones, {2, 3}), View(x, {2, 3}), View(dx, {2, 3}));
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(y[i], RefGelu(x[i]), 1e-6 * (1 + std::abs(x[i]))) << "x = " << x[i];
    EXPECT_NEAR(dx[i], x[i] > 0 ? 1.0f : 0.0f, 1e-6) << "x = " << x[i];
  }
}

TEST(GeluTest, BackwardMatchesFiniteDifferences) {
  auto ops = MakeCpuOps();
  auto x = Random(4099, 2, -6.0f, 6.0f), dy = Random(4099, 3);
  std::vector<float> dx(x.size(), 5.0f);
  const Tensor shape_t = View(x, {4099});
  ops->GeluBackward(View(dy, {4099}), shape_t, View(dx, {4099}));
  // The objective is separable, so each element's derivative is a 1-D central difference.
  std::vector<double> want(x.size());
  const double h = 1e-5;
  for (size_t i = 0; i < x.size(); ++i) {
    want[i] = dy[i] * (RefGelu(x[i] + h) - RefGelu(x[i] - h)) / (2 * h);
  }
  ExpectClose(dx, want, 1e-4, "dx");
}

TEST(GeluTest, RejectsMismatchedShapesAndOtherDtypes) {
  auto ops = MakeCpuOps();
  std::vector<float> x(6), y(6);
  testing::ExpectErrorMentions([&] { ops->GeluForward(View(x, {2, 3}), View(y, {3, 2})); },
                               {"GeluForward", "y", "[2, 3]"});
  Tensor ints(x.data(), DType::kI32, {2, 3});
  testing::ExpectErrorMentions([&] { ops->GeluForward(ints, View(y, {2, 3})); },
                               {"GeluForward", "x", "int32"});
}

}  // namespace
}  // namespace ztrain::kernels
