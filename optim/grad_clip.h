#pragma once
// Global-norm gradient clipping as DeepSpeed does it (gradient_clipping in the config).
//
// The norm is computed, not applied: the coefficient goes to AdamStep as grad_scale, so the
// gradients are read once. Sums are in double and deterministic: the same gradients give the
// same bits whatever the thread count or SIMD kernel (Note [Deterministic squared sum] in
// optim/adam_kernels.h). Thread safe. Gradients must be fp32 host tensors (ztrain::Error
// otherwise), except for the Ops overload, which also sums device gradients. A NaN or Inf
// gradient makes the norm NaN or Inf; it is returned, not thrown, so the caller can report it
// and skip the step as DeepSpeed does on overflow.
#include <span>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "optim/adam.h"

namespace ztrain::optim {

// Sum of squares of every element of every tensor. Under data or tensor parallelism each
// rank sums its shard, the sums are all-reduced, and the norm is sqrt of the total.
double GradSquaredSum(std::span<const Tensor> grads, AdamImpl impl = AdamImpl::kAuto);

// The same where the gradients live. All on the host: the function above (AdamImpl::kAuto),
// bit for bit, and `ops` is not used. Otherwise every gradient must be on ops' device:
// ops.SumSquares of each (fp32, bf16 or fp16 on CUDA; each call synchronises the stream), added in
// order, so the result is deterministic but not bitwise the host's (another summation order).
// A gradient on another device throws ztrain::Error naming its index.
double GradSquaredSum(kernels::Ops& ops, std::span<const Tensor> grads);

// sqrt(GradSquaredSum(grads)): the L2 norm of all gradients seen as one vector.
double GlobalNorm(std::span<const Tensor> grads, AdamImpl impl = AdamImpl::kAuto);

// The factor that clips gradients of norm `norm` to `max_norm`, as DeepSpeed's
// clip_grad_norm_ and ZeRO's unscale_and_clip_grads: max_norm / (norm + 1e-6) when that is
// below 1, else 1. Also 1 when max_norm <= 0 (clipping off) or norm is not finite (the step
// is to be skipped, not scaled).
float ClipCoefficient(double norm, double max_norm);

// With a loss scale: the grad_scale that both removes `loss_scale` and clips, given the norm
// of the still-scaled gradients, exactly as ZeRO's unscale_and_clip_grads computes
// 1 / combined_scale: clip = (scaled_norm / loss_scale + 1e-6) / max_norm,
// combined_scale = loss_scale * max(clip, 1).
float UnscaleAndClipCoefficient(double scaled_norm, double loss_scale, double max_norm);

}  // namespace ztrain::optim
