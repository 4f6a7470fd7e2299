#pragma once
// Vectorisable math for the CPU kernels.
//
// glibc's expf is a library call that GCC vectorises only under -ffast-math, which the
// kernels must not use (it breaks inf/NaN handling and reorders reductions). FastExp is the
// Cephes single-precision exp written as straight-line float code, so loops over it become
// AVX-512 code. Relative error < 1e-7 over the whole range; exp(-inf) = 0, overflow gives
// inf, so masked scores (-inf) need no special case. The round-to-nearest trick below needs
// IEEE semantics: never build this file with -ffast-math or -fassociative-math.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

namespace ztrain::kernels::cpu {

inline float FastExp(float x) {
  constexpr float kMax = 88.3762626647949f;   // exp(kMax) is near FLT_MAX
  constexpr float kMin = -87.3365447504019f;  // exp(kMin) is FLT_MIN
  constexpr float kRound = 12582912.0f;       // 1.5 * 2^23: adding it rounds to an integer
  const float xc = std::min(std::max(x, kMin), kMax);
  const float fn = (xc * 1.44269504088896341f + kRound) - kRound;  // round(x / ln 2)
  const float r = xc - fn * 0.693359375f + fn * 2.12194440e-4f;  // x - n ln 2, two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(fn) + 127) << 23;  // 2^n
  float result = y * std::bit_cast<float>(bits);
  result = x < kMin ? 0.0f : result;
  result = x > kMax ? std::numeric_limits<float>::infinity() : result;
  return result;
}

}  // namespace ztrain::kernels::cpu
