#pragma once
// Internal: the CUDA half of the Tensor AdamStep (Note [Adam on tensors] in optim/adam.h).
// Declared without CUDA headers so that adam_tensor.cc compiles in every build; defined in
// optim/cuda/adam_cuda.cu with the CUDA backend, and by optim/cuda_unavailable.cc (which
// throws) without it.
#include "core/tensor.h"
#include "kernels/ops.h"
#include "optim/adam_kernels.h"

namespace ztrain::optim::detail {

// Enqueues the step on the stream of `ops`. The caller has checked dtypes, element counts
// and that every tensor lives on one CUDA device; this checks that `ops` is the CudaOps of
// that device. param_copy may be undefined (no copy).
void AdamStepCuda(kernels::Ops& ops, const AdamKernelArgs& args, const Tensor& param,
                  const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& param_copy);

}  // namespace ztrain::optim::detail
