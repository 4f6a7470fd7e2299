#include "bench/fma_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace ztrain::bench {
namespace {

constexpr int kAccumulators = 16;
constexpr long kInner = 1 << 12;  // iterations between clock reads

volatile float g_sink;  // keeps the loops' results alive

using Clock = std::chrono::steady_clock;

// Each loop returns the FLOPs it did in about `seconds`.
__attribute__((target("avx512f"))) double Fp32Avx512(double seconds, float seed) {
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_set1_ps(seed * static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(seed * 1e-3f);
  long iterations = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  do {
    for (long n = 0; n < kInner; ++n) {
      for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    }
    iterations += kInner;
  } while (Clock::now() < end);
  __m512 sum = acc[0];
  for (int i = 1; i < kAccumulators; ++i) sum = _mm512_add_ps(sum, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  g_sink = lanes[0];
  return static_cast<double>(iterations) * kAccumulators * 16 * 2;
}

__attribute__((target("avx512f,avx512bf16"))) double Bf16Avx512(double seconds, float seed) {
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_set1_ps(seed * static_cast<float>(i));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(seed));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(seed * 1e-3f), _mm512_set1_ps(0.25f));
  long iterations = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  do {
    for (long n = 0; n < kInner; ++n) {
      for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    }
    iterations += kInner;
  } while (Clock::now() < end);
  __m512 sum = acc[0];
  for (int i = 1; i < kAccumulators; ++i) sum = _mm512_add_ps(sum, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  g_sink = lanes[0];
  return static_cast<double>(iterations) * kAccumulators * 16 * 4;
}

__attribute__((target("avx2,fma"))) double Fp32Avx2(double seconds, float seed) {
  __m256 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_set1_ps(seed * static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(seed * 1e-3f);
  long iterations = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  do {
    for (long n = 0; n < kInner; ++n) {
      for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    }
    iterations += kInner;
  } while (Clock::now() < end);
  __m256 sum = acc[0];
  for (int i = 1; i < kAccumulators; ++i) sum = _mm256_add_ps(sum, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  g_sink = lanes[0];
  return static_cast<double>(iterations) * kAccumulators * 8 * 2;
}

// GFLOP/s of `loop` on `threads` threads together, best of 3.
double Rate(double (*loop)(double, float), int threads, double seconds) {
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> flops(static_cast<size_t>(threads), 0.0);
    const auto start = Clock::now();
#pragma omp parallel num_threads(threads)
    flops[static_cast<size_t>(omp_get_thread_num())] =
        loop(seconds, 1.0f + 1e-3f * static_cast<float>(omp_get_thread_num()));
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    double total = 0.0;
    for (double f : flops) total += f;
    best = std::max(best, total / elapsed / 1e9);
  }
  return best;
}

}  // namespace

FmaLimit MeasureFmaLimit(int threads, double seconds) {
  FmaLimit limit;
  if (__builtin_cpu_supports("avx512f")) {
    limit.isa = "AVX-512";
    limit.fp32_gflops = Rate(&Fp32Avx512, threads, seconds);
    if (__builtin_cpu_supports("avx512bf16")) limit.bf16_gflops = Rate(&Bf16Avx512, threads, seconds);
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    limit.isa = "AVX2";
    limit.fp32_gflops = Rate(&Fp32Avx2, threads, seconds);
  }
  return limit;
}

}  // namespace ztrain::bench
