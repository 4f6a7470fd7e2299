// AVX2 + FMA kernels; this file alone is compiled with -mavx2 -mfma (optim/CMakeLists.txt)
// and is only called after the CPU check in adam.cc. The loops are optim/adam_simd.h's.
#include <immintrin.h>

#include "optim/adam_simd.h"

namespace ztrain::optim::detail {
namespace {

// Lanes [0, count) set, for maskload/maskstore of a tail of fewer than 8 floats.
inline __m256i TailMask(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

struct Avx2 {
  using F = __m256;
  using D = __m256d;
  static constexpr int kLanes = 8;
  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F LoadFirst(const float* p, int64_t count) {
    return _mm256_maskload_ps(p, TailMask(count));
  }
  static void StoreFirst(float* p, int64_t count, F x) {
    _mm256_maskstore_ps(p, TailMask(count), x);
  }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F Fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static D ZeroD() { return _mm256_setzero_pd(); }
  static void AddSquares(F x, D& lo, D& hi) {
    D l = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    D h = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    lo = _mm256_add_pd(lo, _mm256_mul_pd(l, l));  // exact: Note [Deterministic squared sum]
    hi = _mm256_add_pd(hi, _mm256_mul_pd(h, h));
  }
  static void StoreD(double* p, D d) { _mm256_storeu_pd(p, d); }
};

}  // namespace

void AdamKernelAvx2(const AdamKernelArgs& a, float* p, const float* g, float* m, float* v,
                    int64_t n) {
  AdamKernel<Avx2>(a, p, g, m, v, n);
}

double SquaredSumAvx2(const float* x, int64_t n) { return SquaredSum<Avx2>(x, n); }

}  // namespace ztrain::optim::detail
