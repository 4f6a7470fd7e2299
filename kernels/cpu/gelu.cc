// GELU, tanh approximation. 0.5 x (1 + tanh(u)) is evaluated as x * sigmoid(2u), the same
// function without tanh's cancellation near -1, so it vectorises through FastExp and stays
// accurate for large |x|.
#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/widen.h"

namespace ztrain::kernels {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// sigmoid(2u) = 0.5 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
inline float HalfOnePlusTanh(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 1.0f / (1.0f + cpu::FastExp(-2.0f * u));
}

}  // namespace

void CpuOps::GeluForward(const Tensor& x, const Tensor& y) {
  if (cpu::AnyHalf(x, y)) {  // Note [Widening adapter], a chunk at a time
    cpu::CheckCpuFloat(x, "GeluForward", "x");
    cpu::CheckCpuFloat(y, x.shape(), "GeluForward", "y");
    cpu::ForEachChunk(
        scratch_, x.numel(), cpu::kChunkElements, [&](cpu::Widened& w, int64_t begin, int64_t end) {
          GeluForward(w.In(cpu::FlatRange(x, begin, end)), w.Out(cpu::FlatRange(y, begin, end)));
        });
    return;
  }
  cpu::CheckCpu(x, "GeluForward", "x");
  cpu::CheckCpu(y, x.shape(), "GeluForward", "y");
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] * HalfOnePlusTanh(xp[i]);
}

// gelu'(x) = s + x s (1 - s) 2 u'(x), s = sigmoid(2u): since 1 - tanh^2(u) = 4 s (1 - s).
void CpuOps::GeluBackward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  if (cpu::AnyHalf(dy, x, dx)) {
    cpu::CheckCpuFloat(x, "GeluBackward", "x");
    cpu::CheckCpuFloat(dy, x.shape(), "GeluBackward", "dy");
    cpu::CheckCpuFloat(dx, x.shape(), "GeluBackward", "dx");
    cpu::ForEachChunk(
        scratch_, x.numel(), cpu::kChunkElements, [&](cpu::Widened& w, int64_t begin, int64_t end) {
          GeluBackward(w.In(cpu::FlatRange(dy, begin, end)), w.In(cpu::FlatRange(x, begin, end)),
                       w.Out(cpu::FlatRange(dx, begin, end)));
        });
    return;
  }
  cpu::CheckCpu(x, "GeluBackward", "x");
  cpu::CheckCpu(dy, x.shape(), "GeluBackward", "dy");
  cpu::CheckCpu(dx, x.shape(), "GeluBackward", "dx");
  const float* xp = x.data<float>();
  const float* g = dy.data<float>();
  float* out = dx.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    const float v = xp[i];
    const float s = HalfOnePlusTanh(v);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
    out[i] = g[i] * (s + 2.0f * v * s * (1.0f - s) * du);
  }
}

}  // namespace ztrain::kernels
