#pragma once
// Internal: the one AdamW loop and the one squared-sum loop, written once over a vector-traits
// type; adam_avx2.cc and adam_avx512.cc each define their traits (in an anonymous namespace,
// so every instantiation has internal linkage and is compiled with that file's ISA flags
// only) and instantiate these. Include nothing else here: see adam_kernels.h.
//
// A traits type V provides, all static and inline:
//   F (float vector, kLanes floats), D (double vector, kLanes / 2 doubles), kLanes;
//   Set1, Load, Store, LoadFirst(p, count) (lanes >= count read as 0), StoreFirst(p, count, x);
//   Add, Mul, Div, Sqrt, Fmadd(a, b, c) = a*b + c, Fnmadd(a, b, c) = c - a*b;
//   ZeroD, AddSquares(x, lo, hi): lo += the low half of x squared in double, hi += the high
//   half; StoreD(p, d).
#include <cstdint>

#include "optim/adam_kernels.h"

namespace ztrain::optim::detail {

template <class V>
struct AdamConsts {
  typename V::F lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, wd, grad_scale, bc1,
      bc2;

  explicit AdamConsts(const AdamKernelArgs& a)
      : lr(V::Set1(a.lr)),
        beta1(V::Set1(a.beta1)),
        one_minus_beta1(V::Set1(1.0f - a.beta1)),
        beta2(V::Set1(a.beta2)),
        one_minus_beta2(V::Set1(1.0f - a.beta2)),
        eps(V::Set1(a.eps)),
        wd(V::Set1(a.weight_decay)),
        grad_scale(V::Set1(a.grad_scale)),
        bc1(V::Set1(a.bias_correction1)),
        bc2(V::Set1(a.bias_correction2)) {}
};

// One vector of elements, in registers: Note [DeepSpeed Adam formula], the same operations
// in the same order for every ISA.
template <class V, bool kAdamW>
inline void AdamUpdate(const AdamConsts<V>& c, typename V::F& p, typename V::F g,
                       typename V::F& m, typename V::F& v) {
  g = V::Mul(g, c.grad_scale);
  if constexpr (!kAdamW) g = V::Fmadd(c.wd, p, g);
  m = V::Fmadd(c.beta1, m, V::Mul(c.one_minus_beta1, g));
  v = V::Fmadd(c.beta2, v, V::Mul(V::Mul(c.one_minus_beta2, g), g));
  typename V::F denom = V::Add(V::Sqrt(V::Div(v, c.bc2)), c.eps);
  typename V::F update = V::Div(V::Div(m, c.bc1), denom);
  if constexpr (kAdamW) update = V::Fmadd(c.wd, p, update);
  p = V::Fnmadd(c.lr, update, p);
}

template <class V, bool kAdamW>
void AdamLoop(const AdamKernelArgs& a, float* p, const float* g, float* m, float* v,
              int64_t n) {
  const AdamConsts<V> c(a);
  constexpr int64_t kLanes = V::kLanes;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    typename V::F vp = V::Load(p + i), vm = V::Load(m + i), vv = V::Load(v + i);
    AdamUpdate<V, kAdamW>(c, vp, V::Load(g + i), vm, vv);
    V::Store(p + i, vp);
    V::Store(m + i, vm);
    V::Store(v + i, vv);
  }
  if (i < n) {  // the same arithmetic on a masked tail, so results don't depend on position
    const int64_t k = n - i;
    typename V::F vp = V::LoadFirst(p + i, k), vm = V::LoadFirst(m + i, k);
    typename V::F vv = V::LoadFirst(v + i, k);
    AdamUpdate<V, kAdamW>(c, vp, V::LoadFirst(g + i, k), vm, vv);
    V::StoreFirst(p + i, k, vp);
    V::StoreFirst(m + i, k, vm);
    V::StoreFirst(v + i, k, vv);
  }
}

template <class V>
void AdamKernel(const AdamKernelArgs& a, float* p, const float* g, float* m, float* v,
                int64_t n) {
  if (a.adam_w_mode) {
    AdamLoop<V, true>(a, p, g, m, v, n);
  } else {
    AdamLoop<V, false>(a, p, g, m, v, n);
  }
}

// Note [Deterministic squared sum]: 16 double lanes, lane j holding the elements i % 16 == j,
// whatever the vector width: 16 / kLanes float vectors per block of 16, each squared into two
// double vectors.
template <class V>
double SquaredSum(const float* x, int64_t n) {
  constexpr int kLanes = V::kLanes, kVectors = 16 / V::kLanes;
  static_assert(16 % V::kLanes == 0, "the 16 lanes of the squared sum");
  typename V::D acc[2 * kVectors];
  for (auto& d : acc) d = V::ZeroD();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < kVectors; ++k) {
      V::AddSquares(V::Load(x + i + k * kLanes), acc[2 * k], acc[2 * k + 1]);
    }
  }
  for (int k = 0; k < kVectors; ++k) {  // the tail; lanes past n load 0.0f, which adds nothing
    const int64_t left = n - i - k * kLanes;
    if (left <= 0) break;
    V::AddSquares(V::LoadFirst(x + i + k * kLanes, left < kLanes ? left : kLanes), acc[2 * k],
                  acc[2 * k + 1]);
  }
  alignas(64) double lanes[16];
  for (int k = 0; k < 2 * kVectors; ++k) V::StoreD(lanes + k * (kLanes / 2), acc[k]);
  double sum = 0.0;
  for (double lane : lanes) sum += lane;
  return sum;
}

}  // namespace ztrain::optim::detail
