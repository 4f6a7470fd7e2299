#include "optim/adam.h"

#include <cmath>

#include "core/error.h"
#include "optim/adam_kernels.h"

namespace ztrain::optim {
namespace detail {
namespace {

// Plain C++, compiled for the baseline ISA (ztrain_optim does not take -march): the
// reference the SIMD kernels are tested against, and the fallback on old CPUs.
template <bool kAdamW>
void RunScalar(const AdamKernelArgs& a, float* p, const float* g, float* m, float* v, int64_t n) {
  // Locals, not a.*: the stores below could alias `a` as far as the compiler knows.
  const float lr = a.lr, beta1 = a.beta1, beta2 = a.beta2, eps = a.eps, wd = a.weight_decay;
  const float grad_scale = a.grad_scale, bc1 = a.bias_correction1, bc2 = a.bias_correction2;
  const float one_minus_beta1 = 1.0f - beta1, one_minus_beta2 = 1.0f - beta2;
  for (int64_t i = 0; i < n; ++i) {
    float grad = g[i] * grad_scale;
    if constexpr (!kAdamW) grad = grad + wd * p[i];
    const float mi = beta1 * m[i] + one_minus_beta1 * grad;
    const float vi = beta2 * v[i] + one_minus_beta2 * grad * grad;
    float update = (mi / bc1) / (std::sqrt(vi / bc2) + eps);
    if constexpr (kAdamW) update = update + wd * p[i];
    p[i] = p[i] - lr * update;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void AdamKernelScalar(const AdamKernelArgs& a, float* p, const float* g, float* m, float* v,
                      int64_t n) {
  if (a.adam_w_mode) {
    RunScalar<true>(a, p, g, m, v, n);
  } else {
    RunScalar<false>(a, p, g, m, v, n);
  }
}

double SquaredSumScalar(const float* x, int64_t n) {
  double lanes[16] = {};
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[i];
    lanes[i % 16] += d * d;
  }
  double sum = 0.0;
  for (double lane : lanes) sum += lane;
  return sum;
}

namespace {

float BiasCorrection(float beta, int64_t step) {
  // As FusedAdam: 1 - std::pow(beta, step) with a float beta, evaluated in double.
  return static_cast<float>(1.0 - std::pow(static_cast<double>(beta), static_cast<double>(step)));
}

}  // namespace

AdamKernelArgs KernelArgsFor(const AdamStepArgs& args) {
  ZTRAIN_CHECK(args.step >= 1, "AdamStep: step is 1-based, got ", args.step);
  AdamKernelArgs a{args.lr,         args.beta1, args.beta2, args.eps,        args.weight_decay,
                   args.grad_scale, 1.0f,       1.0f,       args.adam_w_mode};
  if (args.bias_correction) {
    a.bias_correction1 = BiasCorrection(args.beta1, args.step);
    a.bias_correction2 = BiasCorrection(args.beta2, args.step);
  }
  return a;
}

AdamImpl ResolveImpl(AdamImpl impl) {
  if (impl == AdamImpl::kAuto) return BestAdamImpl();
  ZTRAIN_CHECK(AdamImplAvailable(impl), "AdamImpl '", AdamImplName(impl),
               "' is not supported by this CPU; use AdamImpl::kAuto or '",
               AdamImplName(BestAdamImpl()), "'");
  return impl;
}

}  // namespace detail

namespace {

using AdamKernel = void (*)(const detail::AdamKernelArgs&, float*, const float*, float*, float*,
                            int64_t);

AdamKernel KernelFor(AdamImpl impl) {
  switch (impl) {
    case AdamImpl::kAvx512:
      return detail::AdamKernelAvx512;
    case AdamImpl::kAvx2:
      return detail::AdamKernelAvx2;
    default:
      return detail::AdamKernelScalar;
  }
}

// Work is split in blocks of kBlock elements (a multiple of 16, so every vector but the
// array's last is full); schedule(static) hands each thread one contiguous run of blocks.
constexpr int64_t kBlock = 16384;
constexpr int64_t kParallelMin = 4 * kBlock;

}  // namespace

AdamImpl BestAdamImpl() {
  if (AdamImplAvailable(AdamImpl::kAvx512)) return AdamImpl::kAvx512;
  if (AdamImplAvailable(AdamImpl::kAvx2)) return AdamImpl::kAvx2;
  return AdamImpl::kScalar;
}

bool AdamImplAvailable(AdamImpl impl) {
  __builtin_cpu_init();  // idempotent; needed if we run before libgcc's own constructor
  switch (impl) {
    case AdamImpl::kAuto:
    case AdamImpl::kScalar:
      return true;
    case AdamImpl::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case AdamImpl::kAvx512:
      return __builtin_cpu_supports("avx512f");
  }
  return false;
}

const char* AdamImplName(AdamImpl impl) {
  switch (impl) {
    case AdamImpl::kAuto:
      return "auto";
    case AdamImpl::kScalar:
      return "scalar";
    case AdamImpl::kAvx2:
      return "avx2";
    case AdamImpl::kAvx512:
      return "avx512";
  }
  return "?";
}

void AdamStep(const AdamStepArgs& args, float* param, const float* grad, float* m, float* v,
              int64_t n, AdamImpl impl) {
  const detail::AdamKernelArgs a = detail::KernelArgsFor(args);  // checks step
  ZTRAIN_CHECK(n >= 0, "AdamStep: negative element count ", n);
  const AdamKernel kernel = KernelFor(detail::ResolveImpl(impl));
  if (n == 0) return;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlock;
    const int64_t count = begin + kBlock <= n ? kBlock : n - begin;
    kernel(a, param + begin, grad + begin, m + begin, v + begin, count);
  }
}

AdamStepArgs AdamArgsFor(const OptimizerConfig& config, const ParamGroup& group, double lr,
                         int64_t step, float grad_scale) {
  AdamStepArgs args;
  args.lr = static_cast<float>(lr * group.lr_scale);
  args.beta1 = static_cast<float>(config.beta1);
  args.beta2 = static_cast<float>(config.beta2);
  args.eps = static_cast<float>(config.eps);
  args.weight_decay = static_cast<float>(group.weight_decay);
  args.adam_w_mode = config.adam_w_mode;
  args.bias_correction = config.bias_correction;
  args.step = step;
  args.grad_scale = grad_scale;
  return args;
}

}  // namespace ztrain::optim
