// LayerNorm over the last dimension, eps = 1e-5 (GPT-2), on the GPU; the same arithmetic as
// kernels/cpu/layernorm.cc (two-pass variance, fp32 statistics) on fp32, bf16 or fp16 tensors.
//
// Forward and the input gradient take one warp per row (a row's reduction is a fixed
// butterfly, so the bits do not change between runs). The parameter gradients are summed
// over rows without atomics (Note [Norm parameter gradients] in norm_grad.cuh), before the
// dx kernel writes, so dx may alias dy or x.
#include <array>

#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"
#include "kernels/cuda/norm_grad.cuh"
#include "kernels/cuda/widen.h"

namespace ztrain::kernels::cuda {
namespace {

constexpr float kEps = 1e-5f;

template <typename T>
__global__ void LayerNormForwardKernel(const T* x, const T* w, const T* b, int64_t rows,
                                       int64_t ch, T* y, float* mean_out, float* rstd_out) {
  const int64_t row = int64_t{blockIdx.x} * kNormRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // a whole warp leaves together: the shuffles stay full
  const T* xr = x + row * ch;
  T* yr = y + row * ch;
  float sum = 0.0f;
  for (int64_t c = lane; c < ch; c += 32) sum += ToFloat(xr[c]);
  const float mean = WarpSum(sum) / static_cast<float>(ch);
  float var = 0.0f;  // two passes: no cancellation when |mean| >> std
  for (int64_t c = lane; c < ch; c += 32) {
    const float d = ToFloat(xr[c]) - mean;
    var += d * d;
  }
  const float rstd = 1.0f / sqrtf(WarpSum(var) / static_cast<float>(ch) + kEps);
  for (int64_t c = lane; c < ch; c += 32) {
    yr[c] = FromFloat<T>((ToFloat(xr[c]) - mean) * rstd * ToFloat(w[c]) + ToFloat(b[c]));
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// dx = rstd * (w dy - mean(w dy) - xhat * mean(w dy xhat)), xhat = (x - mean) * rstd. Each
// lane reads dy[c] and x[c] before writing dx[c] at the same index, so dx may alias them.
template <typename T>
__global__ void LayerNormInputGradKernel(const T* dy, const T* x, const T* w,
                                         const float* mean, const float* rstd, int64_t rows,
                                         int64_t ch, T* dx) {
  const int64_t row = int64_t{blockIdx.x} * kNormRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* gr = dy + row * ch;
  const T* xr = x + row * ch;
  T* dxr = dx + row * ch;
  const float m = mean[row], s = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t c = lane; c < ch; c += 32) {
    const float g = ToFloat(w[c]) * ToFloat(gr[c]);
    sum_g += g;
    sum_gx += g * (ToFloat(xr[c]) - m) * s;
  }
  const float mean_g = WarpSum(sum_g) / static_cast<float>(ch);
  const float mean_gx = WarpSum(sum_gx) / static_cast<float>(ch);
  for (int64_t c = lane; c < ch; c += 32) {
    const float xhat = (ToFloat(xr[c]) - m) * s;
    dxr[c] = FromFloat<T>((ToFloat(w[c]) * ToFloat(gr[c]) - mean_g - xhat * mean_gx) * s);
  }
}

// The terms of dweight and dbias at (r, c): dy * xhat and dy.
template <typename T>
struct LayerNormParamTerms {
  const T* dy;
  const T* x;
  const float* mean;
  const float* rstd;
  int64_t ch;
  __device__ void operator()(int64_t r, int64_t c, float (&v)[2]) const {
    const float g = ToFloat(dy[r * ch + c]);
    v[0] = g * (ToFloat(x[r * ch + c]) - mean[r]) * rstd[r];
    v[1] = g;
  }
};

NormDims CheckLayerNormArgs(Device device, const Tensor& x, const Tensor& weight,
                            const Tensor& mean, const Tensor& rstd, const char* op) {
  const NormDims d = CheckNormArgs(device, x, weight, op);
  CheckRowStat(device, mean, d, op, "mean");
  CheckRowStat(device, rstd, d, op, "rstd");
  return d;
}

}  // namespace

void CudaOps::LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                               const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  constexpr const char* kOp = "LayerNormForward";
  if (NeedsWidening({x, weight, bias, y})) {  // Note [Mixed dtypes on CUDA]
    Widened w(*this);
    LayerNormForward(w.In(x), w.In(weight), w.In(bias), w.Out(y), mean, rstd);
    w.Commit();
    return;
  }
  const NormDims d = CheckLayerNormArgs(device(), x, weight, mean, rstd, kOp);
  CheckLike(bias, weight, kOp, "bias");
  CheckLike(y, x, kOp, "y");
  CheckNormLaunch(x, d, kOp);
  if (d.rows == 0) return;
  DispatchFloat(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    LayerNormForwardKernel<T><<<NormRowBlocks(d.rows), kThreads, 0, stream_>>>(
        x.data<const T>(), weight.data<const T>(), bias.data<const T>(), d.rows, d.channels,
        y.data<T>(), mean.data<float>(), rstd.data<float>());
    ZTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void CudaOps::LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                const Tensor& dweight, const Tensor& dbias) {
  constexpr const char* kOp = "LayerNormBackward";
  // dweight and dbias of one dtype: the weight's, or fp32 (mixed precision) run directly.
  const bool one_grad_type =
      !dweight.defined() || !dbias.defined() || dweight.dtype() == dbias.dtype();
  if (NeedsWidening({dy, x, weight, dx}, {dweight, dbias}) || !one_grad_type) {
    Widened w(*this);
    LayerNormBackward(w.In(dy), w.In(x), w.In(weight), mean, rstd, w.Out(dx), w.InOut(dweight),
                      w.InOut(dbias));
    w.Commit();
    return;
  }
  const NormDims d = CheckLayerNormArgs(device(), x, weight, mean, rstd, kOp);
  CheckLike(dy, x, kOp, "dy");
  CheckLike(dx, x, kOp, "dx");
  if (dweight.defined()) CheckGrad(dweight, weight, kOp, "dweight");
  if (dbias.defined()) CheckGrad(dbias, weight, kOp, "dbias");
  const DType grad_type = dweight.defined() ? dweight.dtype() : dbias.dtype();
  CheckNormLaunch(x, d, kOp);
  if (d.rows == 0 || d.channels == 0) return;
  DispatchFloat(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const LayerNormParamTerms<T> terms{dy.data<const T>(), x.data<const T>(),
                                       mean.data<const float>(), rstd.data<const float>(),
                                       d.channels};
    // An undefined (frozen) dweight or dbias is null: skipped (Note [Frozen parameters]).
    DispatchGrad<T>(grad_type, [&](auto grad_tag) {
      using G = typename decltype(grad_tag)::type;
      AccumulateNormParamGrads<2>(*this, terms, d, std::array<G*, 2>{dweight.data<G>(),
                                                                     dbias.data<G>()});
    });
    // After the partials: dx may alias dy or x.
    LayerNormInputGradKernel<T><<<NormRowBlocks(d.rows), kThreads, 0, stream_>>>(
        dy.data<const T>(), x.data<const T>(), weight.data<const T>(), mean.data<const float>(),
        rstd.data<const float>(), d.rows, d.channels, dx.data<T>());
    ZTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ztrain::kernels::cuda
