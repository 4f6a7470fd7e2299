#pragma once
// AdamW step on flat fp32 arrays, with DeepSpeed's semantics (see Note [DeepSpeed Adam formula]).
//
// AdamStep updates `param`, `m` (exp_avg) and `v` (exp_avg_sq) in place from `grad`, for n
// elements, OpenMP-parallel over n. The arrays must not overlap. Every kernel (scalar
// reference, AVX2+FMA, AVX-512) is compiled into the same binary and picked at run time from
// what the CPU supports (kAuto), or named explicitly (tests, benchmarks). The result of an
// element does not depend on the thread count. Thread safe: no state beyond the arguments.
// Fails with ztrain::Error for step < 1, n < 0 or an impl the CPU cannot run.
//
// The Tensor overload is the mixed-precision step ("fp32 master, bf16 params") on whichever
// device holds the tensors; see its comment and Note [Adam on tensors].
#include <cstdint>

#include "core/config.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "optim/param_groups.h"

namespace ztrain::optim {

// Note [DeepSpeed Adam formula]
// We match DeepSpeed's FusedAdam kernel (csrc/adam/multi_tensor_adam.cu, AdamFunctor) and
// add a gradient multiplier in front, used for clipping and loss-scale removal:
//   g  = grad * grad_scale
//   g += weight_decay * p                    (L2 mode only: adam_w_mode == false)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   bc1 = 1 - beta1^step, bc2 = 1 - beta2^step   (both 1 without bias_correction; computed
//                                                  in double, rounded to float, as FusedAdam)
//   update = (m / bc1) / (sqrt(v / bc2) + eps)
//   update += weight_decay * p               (decoupled mode only, p before this step)
//   p -= lr * update
// DeepSpeed's CPU Adam (csrc/includes/cpu_adam.h, Step_AVX) computes the same quantity in
// another order: p *= (1 - lr*wd) first, denominator sqrt(v) * (1/sqrt(bc2)) + eps; the two
// differ only by float rounding. The SIMD kernels here fuse multiply-adds, the scalar one
// does not, so implementations agree to a few ulps, not bit for bit.

enum class AdamImpl { kAuto, kScalar, kAvx2, kAvx512 };

struct AdamStepArgs {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adam_w_mode = true;  // true: decoupled decay (AdamW); false: L2 added to g
  bool bias_correction = true;
  int64_t step = 1;         // 1-based count of steps applied to this state
  float grad_scale = 1.0f;  // multiplies the gradient first (clipping, 1/loss_scale)
};

void AdamStep(const AdamStepArgs& args, float* param, const float* grad, float* m, float* v,
              int64_t n, AdamImpl impl = AdamImpl::kAuto);

// Note [Adam on tensors]
// The same step on tensors, dispatched on where they live:
// - param, m, v: fp32, one element count n; param is the fp32 master copy.
// - grad: fp32 or bf16, n elements.
// - param_copy: optional (an undefined Tensor() = none), bf16 or fp32, n elements. After the
//   update it receives the new param, rounded to nearest-even for bf16: the low-precision
//   weights the forward pass reads.
// All on the host (cpu): the pointer AdamStep above with AdamImpl::kAuto, then param_copy is
// written; `ops` is not used, so ZeRO-Offload may step host tensors while training on a GPU.
// A bf16 grad is widened to fp32 in chunks of 2^20 elements (a multiple of 16, so the result
// is bitwise that of the pointer AdamStep on the widened gradient).
// All on one CUDA device: one kernel is enqueued on the stream of `ops`, which must be the
// kernels::cuda::CudaOps of that device (as for every CudaOps op, that device must be the
// current one); it returns without synchronising. The kernel performs the float operations
// of the scalar CPU kernel in the same order, without contraction into FMAs, so it agrees
// with AdamImpl::kScalar to the last bit in principle (the CUDA test allows 2 ulps).
// Fails with ztrain::Error, before anything is written or enqueued, for step < 1, a tensor of
// another dtype, element count or device than the list above asks (the message names the
// argument and what was expected), `ops` that is not the CudaOps of the tensors' device, or
// CUDA tensors in a build without CUDA. The tensors must not overlap.
void AdamStep(kernels::Ops& ops, const AdamStepArgs& args, const Tensor& param, const Tensor& grad,
              const Tensor& m, const Tensor& v, const Tensor& param_copy = Tensor());

// The fastest implementation this CPU runs (never kAuto).
AdamImpl BestAdamImpl();
// kAuto and kScalar are always available.
bool AdamImplAvailable(AdamImpl impl);
// "auto", "scalar", "avx2", "avx512".
const char* AdamImplName(AdamImpl impl);

// The step arguments for the parameters of `group` (Note [Parameter groups]): `lr` from the
// schedule (times the group's lr_scale), the group's weight decay, `step` 1-based,
// `grad_scale` from ClipCoefficient (and loss scaling).
AdamStepArgs AdamArgsFor(const OptimizerConfig& config, const ParamGroup& group, double lr,
                         int64_t step, float grad_scale);

namespace detail {
// `impl`, or BestAdamImpl() for kAuto; throws ztrain::Error if this CPU cannot run it.
AdamImpl ResolveImpl(AdamImpl impl);
}  // namespace detail

}  // namespace ztrain::optim
