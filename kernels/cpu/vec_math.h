#pragma once
// Vectorisable math for the CPU kernels.
//
// glibc's expf is a library call that GCC vectorises only under -ffast-math, which the
// kernels must not use (it breaks inf/NaN handling and reorders reductions). FastExp is the
// Cephes single-precision exp written as straight-line float code, so loops over it become
// AVX-512 code. Relative error < 1e-7 over the whole range; exp(-inf) = 0, overflow gives
// inf, so masked scores (-inf) need no special case. The round-to-nearest trick below needs
// IEEE semantics: never build this file with -ffast-math or -fassociative-math.
//
// FastExpOf is the one body, for a float or for a GCC vector of floats (F) with the int32 type
// of the same shape (I): the attention softmax calls it on 16 lanes at once
// (kernels/cpu/attention_tile.cc), because GCC vectorises loops over the scalar form at the
// tuning's preferred width (256 bits on this project's AMD machines).
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace ztrain::kernels::cpu {

template <typename F, typename I>
inline F FastExpOf(F x) {
  constexpr float kMax = 88.3762626647949f;   // exp(kMax) is near FLT_MAX
  constexpr float kMin = -87.3365447504019f;  // exp(kMin) is FLT_MIN
  constexpr float kRound = 12582912.0f;       // 1.5 * 2^23: adding it rounds to an integer
  const F low = x < kMin ? F{} + kMin : x;    // std::min(std::max(x, kMin), kMax), NaN kept
  const F xc = low > kMax ? F{} + kMax : low;
  const F fn = (xc * 1.44269504088896341f + kRound) - kRound;  // round(x / ln 2)
  const F r = xc - fn * 0.693359375f + fn * 2.12194440e-4f;    // x - n ln 2, two parts
  F p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const F y = p * r * r + r + 1.0f;
  I n;
  if constexpr (std::is_same_v<F, float>) {
    n = static_cast<I>(fn);
  } else {
    n = __builtin_convertvector(fn, I);
  }
  const I bits = (n + 127) << 23;  // 2^n
  F result = y * std::bit_cast<F>(bits);
  result = x < kMin ? F{} : result;
  return x > kMax ? F{} + std::numeric_limits<float>::infinity() : result;
}

inline float FastExp(float x) { return FastExpOf<float, int32_t>(x); }

}  // namespace ztrain::kernels::cpu
