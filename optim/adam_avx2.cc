// AVX2 + FMA kernels; this file alone is compiled with -mavx2 -mfma (optim/CMakeLists.txt)
// and is only called after the CPU check in adam.cc. Formula: Note [DeepSpeed Adam formula].
#include <immintrin.h>

#include "optim/adam_kernels.h"

namespace ztrain::optim::detail {
namespace {

struct Consts256 {
  __m256 lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, wd, grad_scale, bc1, bc2;
};

Consts256 Broadcast(const AdamKernelArgs& a) {
  return {_mm256_set1_ps(a.lr),
          _mm256_set1_ps(a.beta1),
          _mm256_set1_ps(1.0f - a.beta1),
          _mm256_set1_ps(a.beta2),
          _mm256_set1_ps(1.0f - a.beta2),
          _mm256_set1_ps(a.eps),
          _mm256_set1_ps(a.weight_decay),
          _mm256_set1_ps(a.grad_scale),
          _mm256_set1_ps(a.bias_correction1),
          _mm256_set1_ps(a.bias_correction2)};
}

// Lanes [0, count) set, for maskload/maskstore of a tail of fewer than 8 floats.
inline __m256i TailMask(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// One vector of 8 elements, in registers; the same operations as the AVX-512 kernel.
template <bool kAdamW>
inline void Update(const Consts256& c, __m256& p, __m256 g, __m256& m, __m256& v) {
  g = _mm256_mul_ps(g, c.grad_scale);
  if constexpr (!kAdamW) g = _mm256_fmadd_ps(c.wd, p, g);
  m = _mm256_fmadd_ps(c.beta1, m, _mm256_mul_ps(c.one_minus_beta1, g));
  v = _mm256_fmadd_ps(c.beta2, v, _mm256_mul_ps(_mm256_mul_ps(c.one_minus_beta2, g), g));
  __m256 denom = _mm256_add_ps(_mm256_sqrt_ps(_mm256_div_ps(v, c.bc2)), c.eps);
  __m256 update = _mm256_div_ps(_mm256_div_ps(m, c.bc1), denom);
  if constexpr (kAdamW) update = _mm256_fmadd_ps(c.wd, p, update);
  p = _mm256_fnmadd_ps(c.lr, update, p);
}

template <bool kAdamW>
void Run(const AdamKernelArgs& a, float* p, const float* g, float* m, float* v, int64_t n) {
  const Consts256 c = Broadcast(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 vp = _mm256_loadu_ps(p + i), vm = _mm256_loadu_ps(m + i);
    __m256 vv = _mm256_loadu_ps(v + i);
    Update<kAdamW>(c, vp, _mm256_loadu_ps(g + i), vm, vv);
    _mm256_storeu_ps(p + i, vp);
    _mm256_storeu_ps(m + i, vm);
    _mm256_storeu_ps(v + i, vv);
  }
  if (i < n) {  // the same arithmetic on a masked tail, so results don't depend on position
    const __m256i k = TailMask(n - i);
    __m256 vp = _mm256_maskload_ps(p + i, k), vm = _mm256_maskload_ps(m + i, k);
    __m256 vv = _mm256_maskload_ps(v + i, k);
    Update<kAdamW>(c, vp, _mm256_maskload_ps(g + i, k), vm, vv);
    _mm256_maskstore_ps(p + i, k, vp);
    _mm256_maskstore_ps(m + i, k, vm);
    _mm256_maskstore_ps(v + i, k, vv);
  }
}

// Adds the exact squares of 8 floats into lanes [0,4) and [4,8) of a 16-lane accumulator.
inline void Accumulate(__m256 x, __m256d& acc_lo, __m256d& acc_hi) {
  __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  acc_lo = _mm256_add_pd(acc_lo, _mm256_mul_pd(lo, lo));
  acc_hi = _mm256_add_pd(acc_hi, _mm256_mul_pd(hi, hi));
}

}  // namespace

void AdamKernelAvx2(const AdamKernelArgs& a, float* p, const float* g, float* m, float* v,
                    int64_t n) {
  if (a.adam_w_mode) {
    Run<true>(a, p, g, m, v, n);
  } else {
    Run<false>(a, p, g, m, v, n);
  }
}

double SquaredSumAvx2(const float* x, int64_t n) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};  // lanes 0-3, 4-7, 8-11, 12-15
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    Accumulate(_mm256_loadu_ps(x + i), acc[0], acc[1]);
    Accumulate(_mm256_loadu_ps(x + i + 8), acc[2], acc[3]);
  }
  if (i < n) {  // masked-off lanes load 0.0f, which adds exactly nothing
    Accumulate(_mm256_maskload_ps(x + i, TailMask(n - i)), acc[0], acc[1]);
    if (n - i > 8) Accumulate(_mm256_maskload_ps(x + i + 8, TailMask(n - i - 8)), acc[2], acc[3]);
  }
  alignas(32) double lanes[16];
  for (int k = 0; k < 4; ++k) _mm256_store_pd(lanes + 4 * k, acc[k]);
  double sum = 0.0;
  for (double lane : lanes) sum += lane;
  return sum;
}

}  // namespace ztrain::optim::detail
