// Column windows of a row-major matrix on the GPU (ops.h: AddColumns, CopyColumns): one
// grid-stride loop over the window's elements each. AddColumns takes fp32, bf16 or fp16
// (fp32 arithmetic, one rounding); CopyColumns moves 2- or 4-byte elements, any dtype.
#include <cstdint>

#include "kernels/column_window.h"
#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"

namespace ztrain::kernels::cuda {
namespace {

// Element i of a window of `width` columns is at row i / width, column i % width; `y` and
// `x` below point at the window's first column, rows `stride` elements apart.
template <typename T>
__global__ void AddColumnsKernel(T* y, int64_t stride, const T* x, int64_t width, float alpha,
                                 int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    T* dst = y + (i / width) * stride + i % width;
    *dst = FromFloat<T>(ToFloat(*dst) + alpha * ToFloat(x[i]));
  }
}

template <typename T>
__global__ void CopyColumnsKernel(const T* x, int64_t stride, T* y, int64_t width, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = x[(i / width) * stride + i % width];
  }
}

}  // namespace

void CudaOps::AddColumns(const Tensor& y, int64_t column, const Tensor& x, float alpha) {
  constexpr const char* kOp = "AddColumns";
  CheckOnDevice(y, device(), kOp, "y");
  const DType dtype = y.dtype();
  ZTRAIN_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16, kOp,
               ": y has dtype ", DTypeName(dtype), ", expected fp32, bf16 or fp16");
  CheckOnDevice(x, device(), kOp, "x");
  const ColumnWindow win = CheckColumnWindow(y, "y", column, x, "x", kOp);
  const int64_t n = win.rows * win.width;
  if (n == 0) return;
  DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    AddColumnsKernel<T><<<GridFor(n), kThreads, 0, stream_>>>(
        y.data<T>() + column, win.full_width, x.data<const T>(), win.width, alpha, n);
    ZTRAIN_CUDA_CHECK_LAUNCH();
  });
}

// Moves bytes, so any dtype of 2 or 4 bytes.
void CudaOps::CopyColumns(const Tensor& x, int64_t column, const Tensor& y) {
  constexpr const char* kOp = "CopyColumns";
  CheckOnDevice(x, device(), kOp, "x");
  const size_t elem = DTypeSize(x.dtype());
  ZTRAIN_CHECK(elem == 2 || elem == 4, kOp, ": x has dtype ", DTypeName(x.dtype()),
               ", expected a dtype of 2 or 4 bytes");
  CheckOnDevice(y, device(), kOp, "y");
  const ColumnWindow win = CheckColumnWindow(x, "x", column, y, "y", kOp);
  const int64_t n = win.rows * win.width;
  if (n == 0) return;
  if (elem == 2) {
    CopyColumnsKernel<<<GridFor(n), kThreads, 0, stream_>>>(
        x.data<const uint16_t>() + column, win.full_width, y.data<uint16_t>(), win.width, n);
  } else {
    CopyColumnsKernel<<<GridFor(n), kThreads, 0, stream_>>>(
        x.data<const uint32_t>() + column, win.full_width, y.data<uint32_t>(), win.width, n);
  }
  ZTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace ztrain::kernels::cuda
