#include "kernels/cpu/convert.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/check.h"

namespace ztrain::kernels::cpu {
namespace {

constexpr int64_t kLanes = 16;  // floats in one AVX-512 register
// The maskz_ forms with a full mask are the plain conversions; GCC 12 warns about the
// undefined pass-through register of the unmasked ones.

// Chosen once per process from cpuid; immutable afterwards.
bool HasAvx512F() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}
bool HasAvx512Bf16() {
  static const bool has = HasAvx512F() && __builtin_cpu_supports("avx512bf16");
  return has;
}

void WidenBf16Scalar(const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
}
void WidenF16Scalar(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}
void NarrowBf16Scalar(const float* src, uint16_t* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}
void NarrowF16Scalar(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}

// VCVTPH2PS is exact but quiets signalling NaNs, which HalfToFloat keeps: vectors holding a
// NaN take the scalar path.
__attribute__((target("avx512f"))) void WidenF16Avx512(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m512 v = _mm512_maskz_cvtph_ps(0xffff, h);
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0) {  // keeps a signalling NaN signalling
      WidenF16Scalar(src + i, dst + i, kLanes);
      continue;
    }
    _mm512_storeu_ps(dst + i, v);
  }
  WidenF16Scalar(src + i, dst + i, n - i);
}

// VCVTPS2PH rounds to nearest even and keeps subnormals, but keeps a NaN's payload where
// FloatToHalf returns the canonical quiet NaN: vectors holding a NaN take the scalar path.
__attribute__((target("avx512f"))) void NarrowF16Avx512(const float* src, uint16_t* dst,
                                                        int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m512 v = _mm512_loadu_ps(src + i);
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0) {
      NarrowF16Scalar(src + i, dst + i, kLanes);
      continue;
    }
    const __m256i h =
        _mm512_maskz_cvtps_ph(0xffff, v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  NarrowF16Scalar(src + i, dst + i, n - i);
}

// VCVTNEPS2BF16 rounds to nearest even and quiets NaNs as FloatToBf16 does, but flushes
// fp32 subnormals to zero: vectors holding a nonzero subnormal take the scalar path.
__attribute__((target("avx512f,avx512bf16"))) void NarrowBf16Avx512(const float* src, uint16_t* dst,
                                                                    int64_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i max_subnormal = _mm512_set1_epi32(0x007fffff);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m512 v = _mm512_loadu_ps(src + i);
    const __m512i abs = _mm512_and_si512(_mm512_castps_si512(v), abs_mask);
    // abs - 1 < 0x7fffff (unsigned) exactly for 0 < abs <= 0x7fffff.
    if (_mm512_cmplt_epu32_mask(_mm512_sub_epi32(abs, one), max_subnormal) != 0) {
      NarrowBf16Scalar(src + i, dst + i, kLanes);
      continue;
    }
    const __m256bh h = _mm512_cvtneps_pbh(v);
    std::memcpy(dst + i, &h, sizeof(h));
  }
  NarrowBf16Scalar(src + i, dst + i, n - i);
}

// Runs fn(begin, end) over [0, n) in chunks of kParallelGrain, in parallel when n is large.
template <typename Fn>
void ParallelRanges(int64_t n, Fn fn) {
  const int64_t chunks = (n + kParallelGrain - 1) / kParallelGrain;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    fn(c * kParallelGrain, std::min(n, (c + 1) * kParallelGrain));
  }
}

}  // namespace

void WidenSerial(const void* src, DType src_type, float* dst, int64_t n) {
  const auto* in = static_cast<const uint16_t*>(src);
  switch (src_type) {
    case DType::kF32:
      if (n > 0 && src != dst) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16:
      WidenBf16Scalar(in, dst, n);  // a shift: the compiler vectorises it
      return;
    case DType::kF16:
      if (HasAvx512F()) {
        WidenF16Avx512(in, dst, n);
      } else {
        WidenF16Scalar(in, dst, n);
      }
      return;
    default:
      ZTRAIN_ASSERT(false, "Widen: ", DTypeName(src_type), " is not a float dtype");
  }
}

void NarrowSerial(const float* src, void* dst, DType dst_type, int64_t n) {
  auto* out = static_cast<uint16_t*>(dst);
  switch (dst_type) {
    case DType::kF32:
      if (n > 0 && src != dst) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16:
      if (HasAvx512Bf16()) {
        NarrowBf16Avx512(src, out, n);
      } else {
        NarrowBf16Scalar(src, out, n);
      }
      return;
    case DType::kF16:
      if (HasAvx512F()) {
        NarrowF16Avx512(src, out, n);
      } else {
        NarrowF16Scalar(src, out, n);
      }
      return;
    default:
      ZTRAIN_ASSERT(false, "Narrow: ", DTypeName(dst_type), " is not a float dtype");
  }
}

void Widen(const void* src, DType src_type, float* dst, int64_t n) {
  const size_t elem = DTypeSize(src_type);
  ParallelRanges(n, [&](int64_t begin, int64_t end) {
    WidenSerial(static_cast<const char*>(src) + begin * elem, src_type, dst + begin, end - begin);
  });
}

void Narrow(const float* src, void* dst, DType dst_type, int64_t n) {
  const size_t elem = DTypeSize(dst_type);
  ParallelRanges(n, [&](int64_t begin, int64_t end) {
    NarrowSerial(src + begin, static_cast<char*>(dst) + begin * elem, dst_type, end - begin);
  });
}

void ConvertFloat(const void* src, DType src_type, void* dst, DType dst_type, int64_t n) {
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  const size_t s_elem = DTypeSize(src_type), d_elem = DTypeSize(dst_type);
  if (src_type == dst_type) {
    if (src == dst) return;
    ParallelRanges(n, [&](int64_t begin, int64_t end) {
      std::memcpy(d + begin * d_elem, s + begin * s_elem, (end - begin) * s_elem);
    });
  } else if (src_type == DType::kF32) {
    Narrow(static_cast<const float*>(src), dst, dst_type, n);
  } else if (dst_type == DType::kF32) {
    Widen(src, src_type, static_cast<float*>(dst), n);
  } else {  // bf16 <-> fp16 through an fp32 block on the stack
    constexpr int64_t kStep = 1024;
    ParallelRanges(n, [&](int64_t begin, int64_t end) {
      float block[kStep];
      for (int64_t i = begin; i < end; i += kStep) {
        const int64_t len = std::min(kStep, end - i);
        WidenSerial(s + i * s_elem, src_type, block, len);
        NarrowSerial(block, d + i * d_elem, dst_type, len);
      }
    });
  }
}

}  // namespace ztrain::kernels::cpu
