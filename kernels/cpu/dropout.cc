// CpuOps::Dropout (ops.h; the mask is kernels/dropout.h's), parallel over rows. A 16-bit row
// is widened a block at a time on the stack, scaled in fp32 and rounded once.
#include <algorithm>

#include "core/error.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_ops.h"

namespace ztrain::kernels {
namespace {

constexpr int64_t kBlock = 256;  // columns of a 16-bit row widened at a time

// y[c] = x[c] * scale where the mask keeps (row, first + c), else 0, for c < n.
void DropRow(const float* x, float* y, int64_t n, const DropoutMask& mask, int64_t row,
             int64_t first, float scale) {
  for (int64_t c = 0; c < n; ++c) {
    y[c] = DropoutKeeps(mask, row, first + c) ? x[c] * scale : 0.0f;
  }
}

}  // namespace

void CpuOps::Dropout(const Tensor& x, const DropoutMask& mask, const Tensor& y) {
  constexpr const char* kOp = "Dropout";
  cpu::CheckCpuFloat(x, kOp, "x");
  ZTRAIN_CHECK(x.dim() == 2, kOp, ": x must be [rows, cols], got ", ShapeToString(x.shape()));
  cpu::CheckCpu(y, x.shape(), kOp, "y", x.dtype());
  ZTRAIN_CHECK(mask.p >= 0.0f && mask.p < 1.0f, kOp, ": p must be in [0, 1), got ", mask.p);
  const int64_t rows = x.size(0), cols = x.size(1);
  const float scale = 1.0f / (1.0f - mask.p);
  const DType dtype = x.dtype();
  const size_t elem = DTypeSize(dtype);
  const auto* xp = static_cast<const char*>(x.data());
  auto* yp = static_cast<char*>(y.data());
#pragma omp parallel for schedule(static) if (rows * cols >= cpu::kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const char* xr = xp + r * cols * elem;
    char* yr = yp + r * cols * elem;
    if (dtype == DType::kF32) {
      DropRow(reinterpret_cast<const float*>(xr), reinterpret_cast<float*>(yr), cols, mask, r, 0,
              scale);
      continue;
    }
    float block[kBlock];
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t len = std::min(kBlock, cols - c0);
      cpu::WidenSerial(xr + c0 * elem, dtype, block, len);
      DropRow(block, block, len, mask, r, c0, scale);
      cpu::NarrowSerial(block, yr + c0 * elem, dtype, len);
    }
  }
}

}  // namespace ztrain::kernels
