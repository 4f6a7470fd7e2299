// AVX-512F kernels; this file alone is compiled with -mavx512f (optim/CMakeLists.txt) and is
// only called after the CPU check in adam.cc. Formula: Note [DeepSpeed Adam formula].
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics (sqrt, cvtps_pd, extract) pass a deliberately undefined
// operand, which -Wmaybe-uninitialized reports at every use (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "optim/adam_kernels.h"

namespace ztrain::optim::detail {
namespace {

struct Consts512 {
  __m512 lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, wd, grad_scale, bc1, bc2;
};

Consts512 Broadcast(const AdamKernelArgs& a) {
  return {_mm512_set1_ps(a.lr),
          _mm512_set1_ps(a.beta1),
          _mm512_set1_ps(1.0f - a.beta1),
          _mm512_set1_ps(a.beta2),
          _mm512_set1_ps(1.0f - a.beta2),
          _mm512_set1_ps(a.eps),
          _mm512_set1_ps(a.weight_decay),
          _mm512_set1_ps(a.grad_scale),
          _mm512_set1_ps(a.bias_correction1),
          _mm512_set1_ps(a.bias_correction2)};
}

// One vector of 16 elements, in registers.
template <bool kAdamW>
inline void Update(const Consts512& c, __m512& p, __m512 g, __m512& m, __m512& v) {
  g = _mm512_mul_ps(g, c.grad_scale);
  if constexpr (!kAdamW) g = _mm512_fmadd_ps(c.wd, p, g);
  m = _mm512_fmadd_ps(c.beta1, m, _mm512_mul_ps(c.one_minus_beta1, g));
  v = _mm512_fmadd_ps(c.beta2, v, _mm512_mul_ps(_mm512_mul_ps(c.one_minus_beta2, g), g));
  __m512 denom = _mm512_add_ps(_mm512_sqrt_ps(_mm512_div_ps(v, c.bc2)), c.eps);
  __m512 update = _mm512_div_ps(_mm512_div_ps(m, c.bc1), denom);
  if constexpr (kAdamW) update = _mm512_fmadd_ps(c.wd, p, update);
  p = _mm512_fnmadd_ps(c.lr, update, p);
}

template <bool kAdamW>
void Run(const AdamKernelArgs& a, float* p, const float* g, float* m, float* v, int64_t n) {
  const Consts512 c = Broadcast(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 vp = _mm512_loadu_ps(p + i), vm = _mm512_loadu_ps(m + i);
    __m512 vv = _mm512_loadu_ps(v + i);
    Update<kAdamW>(c, vp, _mm512_loadu_ps(g + i), vm, vv);
    _mm512_storeu_ps(p + i, vp);
    _mm512_storeu_ps(m + i, vm);
    _mm512_storeu_ps(v + i, vv);
  }
  if (i < n) {  // the same arithmetic on a masked tail, so results don't depend on position
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 vp = _mm512_maskz_loadu_ps(k, p + i), vm = _mm512_maskz_loadu_ps(k, m + i);
    __m512 vv = _mm512_maskz_loadu_ps(k, v + i);
    Update<kAdamW>(c, vp, _mm512_maskz_loadu_ps(k, g + i), vm, vv);
    _mm512_mask_storeu_ps(p + i, k, vp);
    _mm512_mask_storeu_ps(m + i, k, vm);
    _mm512_mask_storeu_ps(v + i, k, vv);
  }
}

inline __m256 HighHalf(__m512 x) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
}

inline __m512d Square(__m256 x) {
  __m512d d = _mm512_cvtps_pd(x);
  return _mm512_mul_pd(d, d);  // exact: see Note [Deterministic squared sum]
}

}  // namespace

void AdamKernelAvx512(const AdamKernelArgs& a, float* p, const float* g, float* m, float* v,
                      int64_t n) {
  if (a.adam_w_mode) {
    Run<true>(a, p, g, m, v, n);
  } else {
    Run<false>(a, p, g, m, v, n);
  }
}

double SquaredSumAvx512(const float* x, int64_t n) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();  // lanes 0-7, 8-15
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 xv = _mm512_loadu_ps(x + i);
    lo = _mm512_add_pd(lo, Square(_mm512_castps512_ps256(xv)));
    hi = _mm512_add_pd(hi, Square(HighHalf(xv)));
  }
  if (i < n) {
    __m512 xv = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << (n - i)) - 1), x + i);
    lo = _mm512_add_pd(lo, Square(_mm512_castps512_ps256(xv)));
    hi = _mm512_add_pd(hi, Square(HighHalf(xv)));
  }
  alignas(64) double lanes[16];
  _mm512_store_pd(lanes, lo);
  _mm512_store_pd(lanes + 8, hi);
  double sum = 0.0;
  for (double lane : lanes) sum += lane;
  return sum;
}

}  // namespace ztrain::optim::detail
