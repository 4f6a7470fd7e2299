// FastExp, the vectorisable exp every softmax and GELU kernel relies on.
#include <cmath>
#include <limits>

#include "kernels/cpu/vec_math.h"
#include "kernel_test_util.h"

namespace ztrain::kernels {
namespace {

using cpu::FastExp;

TEST(FastExpTest, RelativeErrorBelowTwoUlpOverTheFiniteRange) {
  double worst = 0.0;
  float worst_x = 0.0f;
  for (float x = -87.0f; x < 88.0f; x += 0.00731f) {
    const double want = std::exp(double{x});
    const double err = std::abs(FastExp(x) - want) / want;
    if (err > worst) {
      worst = err;
      worst_x = x;
    }
  }
  EXPECT_LT(worst, 2.5e-7) << "at x = " << worst_x;
  EXPECT_EQ(FastExp(0.0f), 1.0f);
}

TEST(FastExpTest, HandlesInfinitiesNaNAndOverflow) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FastExp(-kInf), 0.0f);
  EXPECT_EQ(FastExp(-100.0f), 0.0f);
  EXPECT_EQ(FastExp(kInf), kInf);
  EXPECT_EQ(FastExp(100.0f), kInf);
  EXPECT_TRUE(std::isnan(FastExp(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace ztrain::kernels
