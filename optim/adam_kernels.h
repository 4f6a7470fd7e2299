#pragma once
// Internal: the per-ISA kernels behind AdamStep and GradSquaredSum, one translation unit
// each, compiled with that ISA's flags (optim/CMakeLists.txt). Callers must check the CPU
// first (adam.cc does). Each kernel works on one contiguous range, single threaded; the
// OpenMP split lives in the callers.
//
// These headers and the ISA files include nothing with external-linkage inline functions
// (no <vector>, no <cmath> templates): an inline function compiled with AVX-512 flags could
// otherwise be the copy the linker keeps for the whole program.
#include <cstdint>

namespace ztrain::optim {
struct AdamStepArgs;  // optim/adam.h (declared, not included: see above)
}  // namespace ztrain::optim

namespace ztrain::optim::detail {

// AdamStepArgs reduced to what the element loop needs (Note [DeepSpeed Adam formula]).
struct AdamKernelArgs {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float bias_correction1, bias_correction2;  // 1 - beta^step, or 1
  bool adam_w_mode;
};

// The loop's arguments for `args`, bias corrections included (computed in double and rounded
// to float, as FusedAdam). Shared by the CPU step and the CUDA one (optim/cuda/adam_cuda.cu),
// so both divide by the same floats. Throws ztrain::Error for step < 1.
AdamKernelArgs KernelArgsFor(const AdamStepArgs& args);

void AdamKernelScalar(const AdamKernelArgs& a, float* p, const float* g, float* m, float* v,
                      int64_t n);
void AdamKernelAvx2(const AdamKernelArgs& a, float* p, const float* g, float* m, float* v,
                    int64_t n);
void AdamKernelAvx512(const AdamKernelArgs& a, float* p, const float* g, float* m, float* v,
                      int64_t n);

// Note [Deterministic squared sum]
// Sum of x[i]^2 in double over 16 lanes: lane j accumulates the elements i with i % 16 == j
// in index order, then the lanes are added 0..15. A float squared is exact in double, so
// acc + x*x has one rounding whether fused or not, and every ISA returns the same bits.
double SquaredSumScalar(const float* x, int64_t n);
double SquaredSumAvx2(const float* x, int64_t n);
double SquaredSumAvx512(const float* x, int64_t n);

}  // namespace ztrain::optim::detail
