// RMSNorm over the last dimension on the GPU (ops.h: y = x * rstd * weight, rstd =
// 1 / sqrt(mean(x^2) + eps) in fp32, saved as fp32) on fp32, bf16 or fp16 tensors.
//
// Forward and the input gradient take one warp per row, as LayerNorm (layernorm.cu): a row's
// sum is a fixed butterfly, so the bits do not change between runs. dweight is summed over
// rows without atomics (Note [Norm parameter gradients] in norm_grad.cuh), before the dx
// kernel writes, so dx may alias dy or x.
#include <array>
#include <cmath>

#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"
#include "kernels/cuda/norm_grad.cuh"
#include "kernels/cuda/widen.h"

namespace ztrain::kernels::cuda {
namespace {

template <typename T>
__global__ void RmsNormForwardKernel(const T* x, const T* w, int64_t rows, int64_t ch, float eps,
                                     T* y, float* rstd_out) {
  const int64_t row = int64_t{blockIdx.x} * kNormRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // a whole warp leaves together: the shuffles stay full
  const T* xr = x + row * ch;
  T* yr = y + row * ch;
  float sum_sq = 0.0f;
  for (int64_t c = lane; c < ch; c += 32) {
    const float v = ToFloat(xr[c]);
    sum_sq += v * v;
  }
  const float rstd = 1.0f / sqrtf(WarpSum(sum_sq) / static_cast<float>(ch) + eps);
  for (int64_t c = lane; c < ch; c += 32) {
    yr[c] = FromFloat<T>(ToFloat(xr[c]) * rstd * ToFloat(w[c]));
  }
  if (lane == 0) rstd_out[row] = rstd;
}

// dx = rstd * (w dy - xhat * mean(w dy xhat)), xhat = x * rstd. Each lane reads dy[c] and
// x[c] before writing dx[c] at the same index, so dx may alias them.
template <typename T>
__global__ void RmsNormInputGradKernel(const T* dy, const T* x, const T* w, const float* rstd,
                                       int64_t rows, int64_t ch, T* dx) {
  const int64_t row = int64_t{blockIdx.x} * kNormRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* gr = dy + row * ch;
  const T* xr = x + row * ch;
  T* dxr = dx + row * ch;
  const float s = rstd[row];
  float sum_gx = 0.0f;
  for (int64_t c = lane; c < ch; c += 32) {
    sum_gx += ToFloat(w[c]) * ToFloat(gr[c]) * ToFloat(xr[c]) * s;
  }
  const float mean_gx = WarpSum(sum_gx) / static_cast<float>(ch);
  for (int64_t c = lane; c < ch; c += 32) {
    const float xhat = ToFloat(xr[c]) * s;
    dxr[c] = FromFloat<T>((ToFloat(w[c]) * ToFloat(gr[c]) - xhat * mean_gx) * s);
  }
}

// The term of dweight at (r, c): dy * xhat.
template <typename T>
struct RmsNormParamTerm {
  const T* dy;
  const T* x;
  const float* rstd;
  int64_t ch;
  __device__ void operator()(int64_t r, int64_t c, float (&v)[1]) const {
    v[0] = ToFloat(dy[r * ch + c]) * ToFloat(x[r * ch + c]) * rstd[r];
  }
};

NormDims CheckRmsNormArgs(Device device, const Tensor& x, const Tensor& weight,
                          const Tensor& rstd, const char* op) {
  const NormDims d = CheckNormArgs(device, x, weight, op);
  CheckRowStat(device, rstd, d, op, "rstd");
  CheckNormLaunch(x, d, op);
  return d;
}

}  // namespace

void CudaOps::RmsNormForward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                             const Tensor& rstd) {
  constexpr const char* kOp = "RmsNormForward";
  if (NeedsWidening({x, weight, y})) {  // Note [Mixed dtypes on CUDA]
    Widened w(*this);
    RmsNormForward(w.In(x), w.In(weight), eps, w.Out(y), rstd);
    w.Commit();
    return;
  }
  const NormDims d = CheckRmsNormArgs(device(), x, weight, rstd, kOp);
  CheckLike(y, x, kOp, "y");
  ZTRAIN_CHECK(std::isfinite(eps) && eps >= 0.0f, kOp, ": eps = ", eps,
               " must be finite and non-negative");
  if (d.rows == 0) return;
  DispatchFloat(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    RmsNormForwardKernel<T><<<NormRowBlocks(d.rows), kThreads, 0, stream_>>>(
        x.data<const T>(), weight.data<const T>(), d.rows, d.channels, eps, y.data<T>(),
        rstd.data<float>());
    ZTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void CudaOps::RmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& rstd, const Tensor& dx, const Tensor& dweight) {
  constexpr const char* kOp = "RmsNormBackward";
  // dweight of the weight's dtype or fp32 (mixed precision) runs directly.
  if (NeedsWidening({dy, x, weight, dx}, {dweight})) {
    Widened w(*this);
    RmsNormBackward(w.In(dy), w.In(x), w.In(weight), rstd, w.Out(dx), w.InOut(dweight));
    w.Commit();
    return;
  }
  const NormDims d = CheckRmsNormArgs(device(), x, weight, rstd, kOp);
  CheckLike(dy, x, kOp, "dy");
  CheckLike(dx, x, kOp, "dx");
  if (dweight.defined()) CheckGrad(dweight, weight, kOp, "dweight");
  if (d.rows == 0 || d.channels == 0) return;
  DispatchFloat(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const RmsNormParamTerm<T> term{dy.data<const T>(), x.data<const T>(),
                                   rstd.data<const float>(), d.channels};
    // An undefined (frozen) dweight is null: skipped (Note [Frozen parameters]).
    DispatchGrad<T>(dweight.defined() ? dweight.dtype() : x.dtype(), [&](auto grad_tag) {
      using G = typename decltype(grad_tag)::type;
      AccumulateNormParamGrads<1>(*this, term, d, std::array<G*, 1>{dweight.data<G>()});
    });
    // After the partials: dx may alias dy or x.
    RmsNormInputGradKernel<T><<<NormRowBlocks(d.rows), kThreads, 0, stream_>>>(
        dy.data<const T>(), x.data<const T>(), weight.data<const T>(), rstd.data<const float>(),
        d.rows, d.channels, dx.data<T>());
    ZTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ztrain::kernels::cuda
