// CpuOps::Dropout (kernels/dropout.h's mask): drops about p of the elements, scales the rest by
// exactly 1 / (1 - p), is a pure function of the key and the element's place in the whole
// tensor (a piece with offsets is the whole tensor's slice; in place equals out of place), and
// rounds a 16-bit result once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dropout.h"

namespace ztrain::kernels {
namespace {

using testing::Random;
using testing::View;

constexpr int64_t kRows = 192, kCols = 320;

std::vector<float> Dropped(CpuOps& ops, std::vector<float> x, int64_t rows, int64_t cols,
                           const DropoutMask& mask) {
  std::vector<float> y(x.size(), -7.0f);
  ops.Dropout(View(x, {rows, cols}), mask, View(y, {rows, cols}));
  return y;
}

TEST(DropoutTest, DropsAboutPAndScalesTheRestExactly) {
  CpuOps ops;
  const std::vector<float> x = Random(kRows * kCols, 1, 0.5f, 2.0f);  // never 0
  for (const float p : {0.1f, 0.3f, 0.5f}) {
    const DropoutMask mask{DropoutKey(1337, 1, 0), p, 0, 0};
    const std::vector<float> y = Dropped(ops, x, kRows, kCols, mask);
    const float scale = 1.0f / (1.0f - p);
    int64_t dropped = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (y[i] == 0.0f) {
        ++dropped;
      } else {
        ASSERT_EQ(y[i], x[i] * scale) << i;
      }
      ASSERT_EQ(y[i] != 0.0f, DropoutKeeps(mask, static_cast<int64_t>(i) / kCols,
                                           static_cast<int64_t>(i) % kCols));
    }
    // Binomial(n, p): within 5 standard deviations.
    const double n = static_cast<double>(x.size());
    EXPECT_NEAR(static_cast<double>(dropped), n * p, 5.0 * std::sqrt(n * p * (1 - p))) << p;
  }
  const DropoutMask none{DropoutKey(1337, 1, 0), 0.0f, 0, 0};
  EXPECT_EQ(Dropped(ops, x, kRows, kCols, none), x);
}

TEST(DropoutTest, TheMaskIsAFunctionOfTheKeyAndTheWholeTensorsPlace) {
  CpuOps ops;
  const std::vector<float> x = Random(kRows * kCols, 2, 0.5f, 2.0f);
  const DropoutMask whole{DropoutKey(7, 3, 1), 0.3f, 0, 0};
  const std::vector<float> want = Dropped(ops, x, kRows, kCols, whole);
  // A piece (rows of another data-parallel rank, columns of another tensor-parallel piece)
  // draws the whole tensor's mask at its place.
  const int64_t r0 = 64, c0 = 160, rows = 96, cols = 160;
  std::vector<float> piece(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) piece[r * cols + c] = x[(r0 + r) * kCols + c0 + c];
  }
  DropoutMask at = whole;
  at.row_offset = r0;
  at.col_offset = c0;
  const std::vector<float> got = Dropped(ops, piece, rows, cols, at);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(got[r * cols + c], want[(r0 + r) * kCols + c0 + c]) << r << "," << c;
    }
  }
  // In place is the same; another step, micro-batch or seed draws another mask.
  std::vector<float> inplace = x;
  ops.Dropout(View(inplace, {kRows, kCols}), whole, View(inplace, {kRows, kCols}));
  EXPECT_EQ(inplace, want);
  for (const uint64_t key : {DropoutKey(7, 4, 1), DropoutKey(7, 3, 0), DropoutKey(8, 3, 1)}) {
    DropoutMask other = whole;
    other.key = key;
    const std::vector<float> y = Dropped(ops, x, kRows, kCols, other);
    int64_t same = 0;
    for (size_t i = 0; i < y.size(); ++i) same += (y[i] == 0.0f) == (want[i] == 0.0f);
    // Independent masks agree on p^2 + (1-p)^2 = 58 % of the elements.
    EXPECT_LT(static_cast<double>(same) / static_cast<double>(y.size()), 0.65);
  }
}

TEST(DropoutTest, SixteenBitIsTheFp32ResultRoundedOnce) {
  CpuOps ops;
  const std::vector<float> x = Random(kRows * kCols, 3, -2.0f, 2.0f);
  const DropoutMask mask{DropoutKey(1, 1, 0), 0.3f, 5, 11};
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> x16(x.size()), y16(x.size());
    std::vector<float> widened(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x16[i] = dtype == DType::kBF16 ? FloatToBf16(x[i]) : FloatToHalf(x[i]);
      widened[i] = dtype == DType::kBF16 ? Bf16ToFloat(x16[i]) : HalfToFloat(x16[i]);
    }
    ops.Dropout(Tensor(x16.data(), dtype, {kRows, kCols}), mask,
                Tensor(y16.data(), dtype, {kRows, kCols}));
    const std::vector<float> want = Dropped(ops, widened, kRows, kCols, mask);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t rounded = dtype == DType::kBF16 ? FloatToBf16(want[i]) : FloatToHalf(want[i]);
      ASSERT_EQ(y16[i], rounded) << DTypeName(dtype) << " " << i;
    }
  }
}

TEST(DropoutTest, BadArgumentsAreRefusedBeforeWriting) {
  CpuOps ops;
  std::vector<float> x(12, 1.0f), y(12, 3.0f), z(10, 3.0f);
  EXPECT_THROW(ops.Dropout(View(x, {3, 4}), {1, 1.0f, 0, 0}, View(y, {3, 4})), Error);
  EXPECT_THROW(ops.Dropout(View(x, {3, 4}), {1, -0.1f, 0, 0}, View(y, {3, 4})), Error);
  EXPECT_THROW(ops.Dropout(View(x, {3, 4}), {1, 0.5f, 0, 0}, View(y, {4, 3})), Error);
  EXPECT_THROW(ops.Dropout(View(x, {12}), {1, 0.5f, 0, 0}, View(y, {12})), Error);
  for (float v : y) EXPECT_EQ(v, 3.0f);
}

}  // namespace
}  // namespace ztrain::kernels
