// AVX-512F kernels; this file alone is compiled with -mavx512f (optim/CMakeLists.txt) and is
// only called after the CPU check in adam.cc. The loops are optim/adam_simd.h's.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics (sqrt, cvtps_pd, extract) pass a deliberately undefined
// operand, which -Wmaybe-uninitialized reports at every use (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "optim/adam_simd.h"

namespace ztrain::optim::detail {
namespace {

// Lanes [0, count) set, count <= 16.
inline __mmask16 TailMask(int64_t count) {
  return static_cast<__mmask16>((1u << count) - 1);
}

struct Avx512 {
  using F = __m512;
  using D = __m512d;
  static constexpr int kLanes = 16;
  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F LoadFirst(const float* p, int64_t count) {
    return _mm512_maskz_loadu_ps(TailMask(count), p);
  }
  static void StoreFirst(float* p, int64_t count, F x) {
    _mm512_mask_storeu_ps(p, TailMask(count), x);
  }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F Fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static D ZeroD() { return _mm512_setzero_pd(); }
  static void AddSquares(F x, D& lo, D& hi) {
    D l = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    D h = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    lo = _mm512_add_pd(lo, _mm512_mul_pd(l, l));  // exact: Note [Deterministic squared sum]
    hi = _mm512_add_pd(hi, _mm512_mul_pd(h, h));
  }
  static void StoreD(double* p, D d) { _mm512_storeu_pd(p, d); }
};

}  // namespace

void AdamKernelAvx512(const AdamKernelArgs& a, float* p, const float* g, float* m, float* v,
                      int64_t n) {
  AdamKernel<Avx512>(a, p, g, m, v, n);
}

double SquaredSumAvx512(const float* x, int64_t n) { return SquaredSum<Avx512>(x, n); }

}  // namespace ztrain::optim::detail
