// CudaOps::Dropout (ops.h; the mask is kernels/dropout.h's, the same function the CPU backend
// evaluates, so both drop the same elements): a grid-stride loop, one thread per element,
// scaled in fp32 and rounded once.
#include <cstdint>

#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"

namespace ztrain::kernels::cuda {
namespace {

template <typename T>
__global__ void DropoutKernel(const T* x, DropoutMask mask, float scale, int64_t cols, int64_t n,
                              T* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const bool keep = DropoutKeeps(mask, i / cols, i % cols);
    y[i] = FromFloat<T>(keep ? __fmul_rn(ToFloat(x[i]), scale) : 0.0f);
  }
}

}  // namespace

void CudaOps::Dropout(const Tensor& x, const DropoutMask& mask, const Tensor& y) {
  constexpr const char* kOp = "Dropout";
  CheckFloat(x, device(), kOp, "x");
  ZTRAIN_CHECK(x.dim() == 2, kOp, ": x must be [rows, cols], got ", ShapeToString(x.shape()));
  CheckOnDevice(y, device(), x.dtype(), x.shape(), kOp, "y");
  ZTRAIN_CHECK(mask.p >= 0.0f && mask.p < 1.0f, kOp, ": p must be in [0, 1), got ", mask.p);
  const int64_t n = x.numel();
  if (n == 0) return;
  const float scale = 1.0f / (1.0f - mask.p);
  DispatchFloat(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    DropoutKernel<T><<<GridFor(n), kThreads, 0, stream_>>>(x.data<const T>(), mask, scale,
                                                            x.size(1), n, y.data<T>());
    ZTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ztrain::kernels::cuda
