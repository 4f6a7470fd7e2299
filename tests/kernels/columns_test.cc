// AddColumns and CopyColumns against plain loops: windows at both edges, in the middle and
// the whole width, in fp32, bf16 and fp16 (CopyColumns also int32 and uint16), on one thread
// and several. AddColumns uses alpha = 0.75 on values of at most 8 significant bits, so
// alpha * x is exact in fp32 and y + alpha * x is one rounding whether or not the kernel fuses
// the multiply-add: the loop below gives the kernel's bits, then one rounding to the dtype.
#include <string>
#include <vector>

#include "half_test_util.h"
#include "kernels/cpu/cpu_ops.h"

namespace ztrain::kernels {
namespace {

using testing::ExpectErrorMentions;
using testing::HostTensor;

constexpr float kAlpha = 0.75f;

struct WindowCase {
  int64_t rows, full_width, column, width;
  std::string Name() const {
    return "N=" + std::to_string(rows) + " W=" + std::to_string(full_width) +
           " column=" + std::to_string(column) + " w=" + std::to_string(width);
  }
};

// Left edge, right edge, middle, the whole width; then a window past the one-thread grain
// whose 16-bit rows span two widening blocks.
const WindowCase kCases[] = {{37, 50, 0, 20}, {37, 50, 30, 20}, {37, 50, 13, 7},
                             {37, 50, 0, 50}, {5, 1, 0, 1},     {300, 700, 250, 300}};

// A random [rows, cols] tensor of `dtype`; bf16-representable values, so that fp32 holds
// them with 8 significant bits.
HostTensor RandomMatrix(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  std::vector<float> v = testing::Random(rows * cols, seed, -2.0f, 2.0f);
  for (float& x : v) x = Bf16ToFloat(FloatToBf16(x));
  return HostTensor::From(dtype, {rows, cols}, v);
}

TEST(ColumnsTest, AddColumnsMatchesAPlainLoop) {
  CpuOps ops;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const WindowCase& tc : kCases) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + tc.Name());
      HostTensor y = RandomMatrix(dtype, tc.rows, tc.full_width, 1);
      const HostTensor x = RandomMatrix(dtype, tc.rows, tc.width, 2), x_before = x;
      HostTensor want = y;
      for (int64_t r = 0; r < tc.rows; ++r) {
        for (int64_t c = 0; c < tc.width; ++c) {
          const size_t at = r * tc.full_width + tc.column + c;
          want.Set(at, y.Get(at) + kAlpha * x.Get(r * tc.width + c));
        }
      }
      ops.AddColumns(y.tensor(), tc.column, x.tensor(), kAlpha);
      EXPECT_TRUE(y.SameBytes(want)) << "y (the columns outside the window must not change)";
      EXPECT_TRUE(x.SameBytes(x_before)) << "x is an input";
    }
  }
}

TEST(ColumnsTest, CopyColumnsCopiesTheWindowsBytes) {
  CpuOps ops;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kU16}) {
    for (const WindowCase& tc : kCases) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + tc.Name());
      const size_t elem = DTypeSize(dtype);
      std::vector<uint8_t> x(tc.rows * tc.full_width * elem);
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>(i * 131 + 7);
      const std::vector<uint8_t> x_before = x;
      std::vector<uint8_t> y(tc.rows * tc.width * elem, 0xff), want;
      for (int64_t r = 0; r < tc.rows; ++r) {
        const auto row = x.begin() + (r * tc.full_width + tc.column) * elem;
        want.insert(want.end(), row, row + tc.width * elem);
      }
      ops.CopyColumns(Tensor(x.data(), dtype, {tc.rows, tc.full_width}), tc.column,
                      Tensor(y.data(), dtype, {tc.rows, tc.width}));
      EXPECT_EQ(y, want);
      EXPECT_EQ(x, x_before) << "x is an input";
    }
  }
}

TEST(ColumnsTest, BadArgumentsThrowNamingThem) {
  CpuOps ops;
  std::vector<float> big(4 * 10), small(4 * 3), other(5 * 3);
  const Tensor y(big.data(), DType::kF32, {4, 10}), x(small.data(), DType::kF32, {4, 3});
  ExpectErrorMentions([&] { ops.AddColumns(y, -1, x, 1.0f); },
                      {"AddColumns", "column = -1", "x", "0 <= column <= 7"});
  ExpectErrorMentions([&] { ops.AddColumns(y, 8, x, 1.0f); },
                      {"AddColumns", "column = 8", "[4, 10]", "0 <= column <= 7"});
  ExpectErrorMentions([&] { ops.CopyColumns(y, 9, x); }, {"CopyColumns", "column = 9"});
  const Tensor rows5(other.data(), DType::kF32, {5, 3});
  ExpectErrorMentions([&] { ops.AddColumns(y, 0, rows5, 1.0f); },
                      {"AddColumns", "x", "[5, 3]", "expected [4, w]"});
  ExpectErrorMentions([&] { ops.CopyColumns(y, 0, rows5); }, {"CopyColumns", "y", "[5, 3]"});
  ExpectErrorMentions([&] { ops.CopyColumns(x, 0, y); }, {"CopyColumns", "y", "wider than"});
  ExpectErrorMentions([&] { ops.AddColumns(y.View({40}), 0, x, 1.0f); },
                      {"AddColumns", "y", "[40]", "[N, W]"});
  const Tensor half_x(small.data(), DType::kBF16, {4, 3});
  ExpectErrorMentions([&] { ops.AddColumns(y, 0, half_x, 1.0f); },
                      {"AddColumns", "x", "bf16", "y's dtype fp32"});
  ExpectErrorMentions([&] { ops.CopyColumns(y, 0, half_x); },
                      {"CopyColumns", "y", "bf16", "x's dtype fp32"});
  const Tensor ints(big.data(), DType::kI32, {4, 10});
  ExpectErrorMentions([&] { ops.AddColumns(ints, 0, x, 1.0f); },
                      {"AddColumns", "y", "int32", "fp32, bf16 or fp16"});
  ExpectErrorMentions([&] { ops.AddColumns(y, 0, Tensor(), 1.0f); },
                      {"AddColumns", "x", "undefined"});
  const Tensor on_gpu(small.data(), DType::kF32, {4, 3}, Device::Cuda(0));
  ExpectErrorMentions([&] { ops.CopyColumns(y, 0, on_gpu); }, {"CopyColumns", "y", "cuda"});
}

}  // namespace
}  // namespace ztrain::kernels
