// Column windows of a row-major matrix (ops.h: AddColumns, CopyColumns), parallel over rows.
// 16-bit AddColumns widens each row's window a block at a time on the stack, adds in fp32
// with the fp32 path's own loop and rounds once, so it is bitwise the fp32 op on the widened
// values, rounded (Note [16-bit tensors]).
#include <algorithm>
#include <cstring>

#include "kernels/column_window.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_ops.h"

namespace ztrain::kernels {
namespace {

constexpr int64_t kWidenBlock = 256;  // columns of a 16-bit row widened at a time

// y[c] += alpha * x[c] for c < n: the one loop of every dtype.
void AddRow(float* y, const float* x, int64_t n, float alpha) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) y[c] += alpha * x[c];
}

// AddRow on 16-bit rows of `dtype`.
void AddHalfRow(char* y, const char* x, DType dtype, int64_t n, float alpha) {
  const size_t elem = DTypeSize(dtype);
  float yb[kWidenBlock], xb[kWidenBlock];
  for (int64_t c0 = 0; c0 < n; c0 += kWidenBlock) {
    const int64_t len = std::min(kWidenBlock, n - c0);
    cpu::WidenSerial(y + c0 * elem, dtype, yb, len);
    cpu::WidenSerial(x + c0 * elem, dtype, xb, len);
    AddRow(yb, xb, len, alpha);
    cpu::NarrowSerial(yb, y + c0 * elem, dtype, len);
  }
}

}  // namespace

void CpuOps::AddColumns(const Tensor& y, int64_t column, const Tensor& x, float alpha) {
  constexpr const char* kOp = "AddColumns";
  cpu::CheckCpuFloat(y, kOp, "y");
  cpu::CheckCpu(x, kOp, "x", x.dtype());  // defined and on the host; its dtype is y's (below)
  const ColumnWindow win = CheckColumnWindow(y, "y", column, x, "x", kOp);
  if (win.rows == 0 || win.width == 0) return;
  const DType dtype = y.dtype();
  const size_t elem = DTypeSize(dtype);
  auto* yp = static_cast<char*>(y.data());
  const auto* xp = static_cast<const char*>(x.data());
#pragma omp parallel for schedule(static) if (win.rows * win.width >= cpu::kParallelGrain)
  for (int64_t r = 0; r < win.rows; ++r) {
    char* yr = yp + (r * win.full_width + column) * elem;
    const char* xr = xp + r * win.width * elem;
    if (dtype == DType::kF32) {
      AddRow(reinterpret_cast<float*>(yr), reinterpret_cast<const float*>(xr), win.width, alpha);
    } else {
      AddHalfRow(yr, xr, dtype, win.width, alpha);
    }
  }
}

// Moves bytes, so any dtype of 2 or 4 bytes.
void CpuOps::CopyColumns(const Tensor& x, int64_t column, const Tensor& y) {
  constexpr const char* kOp = "CopyColumns";
  cpu::CheckCpu(x, kOp, "x", x.dtype());
  const size_t elem = DTypeSize(x.dtype());
  ZTRAIN_CHECK(elem == 2 || elem == 4, kOp, ": x has dtype ", DTypeName(x.dtype()),
               ", expected a dtype of 2 or 4 bytes");
  cpu::CheckCpu(y, kOp, "y", y.dtype());  // defined and on the host; its dtype is x's (below)
  const ColumnWindow win = CheckColumnWindow(x, "x", column, y, "y", kOp);
  if (win.rows == 0 || win.width == 0) return;
  const auto* xp = static_cast<const char*>(x.data());
  auto* yp = static_cast<char*>(y.data());
  const size_t row_bytes = static_cast<size_t>(win.width) * elem;
#pragma omp parallel for schedule(static) if (win.rows * win.width >= cpu::kParallelGrain)
  for (int64_t r = 0; r < win.rows; ++r) {
    std::memcpy(yp + r * row_bytes, xp + (r * win.full_width + column) * elem, row_bytes);
  }
}

}  // namespace ztrain::kernels
