// SwiGLU, Llama's MLP activation: h = silu(gate) * up, silu(g) = g * sigmoid(g), with
// sigmoid(g) = 1 / (1 + e^-g) through FastExp so the loops vectorise. For g below about -88,
// e^-g overflows to inf and sigmoid to 0: silu is -0, its derivative 0, never NaN.
#include <initializer_list>
#include <utility>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/widen.h"

namespace ztrain::kernels {
namespace {

inline float Sigmoid(float g) { return 1.0f / (1.0f + cpu::FastExp(-g)); }

using Arg = std::pair<const Tensor*, const char*>;

// Every argument is a float tensor on the CPU (fp32 unless any_float) of the first one's shape.
void CheckElementwise(std::initializer_list<Arg> args, bool any_float, const char* op) {
  const Shape& shape = args.begin()->first->shape();
  for (const auto& [t, what] : args) {
    if (any_float) {
      cpu::CheckCpuFloat(*t, shape, op, what);
    } else {
      cpu::CheckCpu(*t, shape, op, what);
    }
  }
}

}  // namespace

void CpuOps::SwiGluForward(const Tensor& gate, const Tensor& up, const Tensor& h) {
  constexpr const char* kOp = "SwiGluForward";
  if (cpu::AnyHalf(gate, up, h)) {  // Note [Widening adapter], a chunk at a time
    CheckElementwise({{&gate, "gate"}, {&up, "up"}, {&h, "h"}}, true, kOp);
    cpu::ForEachChunk(scratch_, gate.numel(), cpu::kChunkElements,
                      [&](cpu::Widened& w, int64_t begin, int64_t end) {
                        SwiGluForward(w.In(cpu::FlatRange(gate, begin, end)),
                                      w.In(cpu::FlatRange(up, begin, end)),
                                      w.Out(cpu::FlatRange(h, begin, end)));
                      });
    return;
  }
  CheckElementwise({{&gate, "gate"}, {&up, "up"}, {&h, "h"}}, false, kOp);
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* out = h.data<float>();
  const int64_t n = gate.numel();
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] * Sigmoid(g[i]) * u[i];
}

// silu'(g) = s + g s (1 - s), s = sigmoid(g).
void CpuOps::SwiGluBackward(const Tensor& dh, const Tensor& gate, const Tensor& up,
                            const Tensor& dgate, const Tensor& dup) {
  constexpr const char* kOp = "SwiGluBackward";
  if (cpu::AnyHalf(dh, gate, up, dgate, dup)) {
    CheckElementwise({{&gate, "gate"}, {&dh, "dh"}, {&up, "up"}, {&dgate, "dgate"}, {&dup, "dup"}},
                     true, kOp);
    cpu::ForEachChunk(scratch_, gate.numel(), cpu::kChunkElements,
                      [&](cpu::Widened& w, int64_t begin, int64_t end) {
                        auto range = [&](const Tensor& t) { return cpu::FlatRange(t, begin, end); };
                        SwiGluBackward(w.In(range(dh)), w.In(range(gate)), w.In(range(up)),
                                       w.Out(range(dgate)), w.Out(range(dup)));
                      });
    return;
  }
  CheckElementwise({{&gate, "gate"}, {&dh, "dh"}, {&up, "up"}, {&dgate, "dgate"}, {&dup, "dup"}},
                   false, kOp);
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  const float* d = dh.data<float>();
  float* dg = dgate.data<float>();
  float* du = dup.data<float>();
  const int64_t n = gate.numel();
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i], ui = u[i],
                di = d[i];  // read before writing: an output may alias an input
    const float s = Sigmoid(gi);
    dg[i] = di * ui * (s + gi * s * (1.0f - s));
    du[i] = di * (gi * s);
  }
}

}  // namespace ztrain::kernels
