// The Tensor AdamStep on a CUDA device (Note [Adam on tensors] in optim/adam.h): one
// grid-stride kernel reads param, grad, m and v once, writes param, m, v and the
// low-precision param_copy, with 16-byte loads when every pointer allows them.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"
#include "optim/cuda/adam_cuda.h"

namespace ztrain::optim::detail {
namespace {

using kernels::cuda::DispatchFloat;
using kernels::cuda::FromFloat;
using kernels::cuda::GridFor;
using kernels::cuda::kThreads;
using kernels::cuda::ToFloat;

constexpr int kVec = 4;  // elements per vector access: 4 fp32 = 16 bytes

template <typename T, int kN>
struct alignas(sizeof(T) * kN) Pack {
  T v[kN];
};

template <int kN, typename T>
__device__ __forceinline__ Pack<T, kN> Load(const T* p) {
  return *reinterpret_cast<const Pack<T, kN>*>(p);
}

template <int kN, typename T>
__device__ __forceinline__ void Store(T* p, const Pack<T, kN>& x) {
  *reinterpret_cast<Pack<T, kN>*>(p) = x;
}

// One element of Note [DeepSpeed Adam formula], with the float operations of the scalar CPU
// kernel (RunScalar in optim/adam.cc) in its order. The _rn intrinsics are IEEE
// round-to-nearest and never contracted into FMAs, so each result is rounded as on the CPU.
__device__ __forceinline__ void AdamElement(const AdamKernelArgs& a, float grad, float& p, float& m,
                                            float& v) {
  float g = __fmul_rn(grad, a.grad_scale);
  if (!a.adam_w_mode) g = __fadd_rn(g, __fmul_rn(a.weight_decay, p));
  m = __fadd_rn(__fmul_rn(a.beta1, m), __fmul_rn(__fsub_rn(1.0f, a.beta1), g));
  v = __fadd_rn(__fmul_rn(a.beta2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, a.beta2), g), g));
  const float denom = __fadd_rn(__fsqrt_rn(__fdiv_rn(v, a.bias_correction2)), a.eps);
  float update = __fdiv_rn(__fdiv_rn(m, a.bias_correction1), denom);
  if (a.adam_w_mode) update = __fadd_rn(update, __fmul_rn(a.weight_decay, p));
  p = __fsub_rn(p, __fmul_rn(a.lr, update));
}

// kN elements per thread and iteration (every pointer aligned to kN elements), then the last
// n % kN one at a time. `copy` may be null (no param_copy).
template <int kN, typename G, typename C>
__global__ void AdamKernel(AdamKernelArgs a, float* p, const G* g, float* m, float* v, C* copy,
                           int64_t n) {
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t vec_end = n / kN * kN;
  for (int64_t i = first * kN; i < vec_end; i += stride * kN) {
    Pack<float, kN> pp = Load<kN>(p + i), mm = Load<kN>(m + i), vv = Load<kN>(v + i);
    const Pack<G, kN> gg = Load<kN>(g + i);
    Pack<C, kN> cc;
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      AdamElement(a, ToFloat(gg.v[k]), pp.v[k], mm.v[k], vv.v[k]);
      cc.v[k] = FromFloat<C>(pp.v[k]);
    }
    Store<kN>(p + i, pp);
    Store<kN>(m + i, mm);
    Store<kN>(v + i, vv);
    if (copy != nullptr) Store<kN>(copy + i, cc);
  }
  for (int64_t i = vec_end + first; i < n; i += stride) {
    float pi = p[i], mi = m[i], vi = v[i];
    AdamElement(a, ToFloat(g[i]), pi, mi, vi);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (copy != nullptr) copy[i] = FromFloat<C>(pi);
  }
}

bool Aligned(const void* ptr, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

template <typename G, typename C>
void Launch(const AdamKernelArgs& a, const Tensor& param, const Tensor& grad, const Tensor& m,
            const Tensor& v, C* copy, cudaStream_t stream) {
  const int64_t n = param.numel();
  float* p = param.data<float>();
  const G* g = grad.data<const G>();
  const bool vectorise = Aligned(p, kVec * sizeof(float)) && Aligned(g, kVec * sizeof(G)) &&
                         Aligned(m.data(), kVec * sizeof(float)) &&
                         Aligned(v.data(), kVec * sizeof(float)) &&
                         Aligned(copy, kVec * sizeof(C));  // null (no copy) is aligned
  if (vectorise) {
    AdamKernel<kVec><<<GridFor((n + kVec - 1) / kVec), kThreads, 0, stream>>>(
        a, p, g, m.data<float>(), v.data<float>(), copy, n);
  } else {  // a view at an odd offset (a ZeRO shard boundary, say)
    AdamKernel<1>
        <<<GridFor(n), kThreads, 0, stream>>>(a, p, g, m.data<float>(), v.data<float>(), copy, n);
  }
  ZTRAIN_CUDA_CHECK_LAUNCH();
}

kernels::cuda::CudaOps& CudaOpsOf(kernels::Ops& ops, Device device) {
  auto* cuda_ops = dynamic_cast<kernels::cuda::CudaOps*>(&ops);
  ZTRAIN_CHECK(cuda_ops != nullptr && cuda_ops->device() == device, "AdamStep: the tensors are on ",
               device.ToString(), " but ops runs on ", ops.device().ToString(),
               cuda_ops ? "" : " and is not a CudaOps", "; pass the CudaOps of ", device.ToString(),
               " (kernels::MakeCudaOps(", device.index, "))");
  return *cuda_ops;
}

}  // namespace

void AdamStepCuda(kernels::Ops& ops, const AdamKernelArgs& args, const Tensor& param,
                  const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& param_copy) {
  const cudaStream_t stream = CudaOpsOf(ops, param.device()).stream();
  if (param.numel() == 0) return;
  const bool has_copy = param_copy.defined();
  const DType copy_dtype = has_copy ? param_copy.dtype() : DType::kBF16;
  DispatchFloat(grad.dtype(), [&](auto grad_tag) {
    using G = typename decltype(grad_tag)::type;
    DispatchFloat(copy_dtype, [&](auto copy_tag) {
      using C = typename decltype(copy_tag)::type;
      C* copy = has_copy ? param_copy.data<C>() : nullptr;
      Launch<G>(args, param, grad, m, v, copy, stream);
    });
  });
}

}  // namespace ztrain::optim::detail
