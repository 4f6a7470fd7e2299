#include "core/dtype.h"

#include "core/error.h"

namespace ztrain {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
    case DType::kU16:
      return 2;
    case DType::kU8:
      return 1;
  }
  ZTRAIN_ASSERT(false, "unknown dtype");
}

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
    case DType::kI32: return "int32";
    case DType::kU16: return "uint16";
    case DType::kU8: return "uint8";
  }
  return "?";
}

DType ParseDType(std::string_view name) {
  if (name == "fp32" || name == "float32" || name == "float") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "fp16" || name == "float16" || name == "half") return DType::kF16;
  if (name == "int32") return DType::kI32;
  if (name == "uint16") return DType::kU16;
  if (name == "uint8") return DType::kU8;
  throw Error(detail::StrCat("unknown dtype '", name, "'; use fp32, bf16 or fp16"));
}

uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;             // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;            // rounds to >= 65520: infinity
  if (abs >= 0x38800000u) {                                  // normal half (>= 2^-14)
    uint32_t m = abs + 0xfffu + ((abs >> 13) & 1u);          // RNE on the 13 dropped bits
    return sign | static_cast<uint16_t>((m - 0x38000000u) >> 13);
  }
  if (abs < 0x33000000u) return sign;                        // below half the smallest subnormal
  // Subnormal half: value = mant * 2^-24. Shift the full mantissa and round to nearest even.
  const int exp = static_cast<int>(abs >> 23);               // biased fp32 exponent
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const int shift = 126 - exp;                               // 14..24 for the subnormal range
  const uint32_t kept = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  uint32_t r = kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
  return sign | static_cast<uint16_t>(r);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return BitsToFloat(sign);
  // Subnormal: mant * 2^-24, exactly representable in fp32.
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

void ConvertFromFloat(const float* src, void* dst, DType dst_type, size_t n) {
  auto* out = static_cast<uint16_t*>(dst);
  const auto count = static_cast<int64_t>(n);
  if (dst_type == DType::kBF16) {
#pragma omp parallel for schedule(static) if (count > 65536)
    for (int64_t i = 0; i < count; ++i) out[i] = FloatToBf16(src[i]);
  } else {
    ZTRAIN_ASSERT(dst_type == DType::kF16);
#pragma omp parallel for schedule(static) if (count > 65536)
    for (int64_t i = 0; i < count; ++i) out[i] = FloatToHalf(src[i]);
  }
}

void ConvertToFloat(const void* src, DType src_type, float* dst, size_t n) {
  const auto* in = static_cast<const uint16_t*>(src);
  const auto count = static_cast<int64_t>(n);
  if (src_type == DType::kBF16) {
#pragma omp parallel for schedule(static) if (count > 65536)
    for (int64_t i = 0; i < count; ++i) dst[i] = Bf16ToFloat(in[i]);
  } else {
    ZTRAIN_ASSERT(src_type == DType::kF16);
#pragma omp parallel for schedule(static) if (count > 65536)
    for (int64_t i = 0; i < count; ++i) dst[i] = HalfToFloat(in[i]);
  }
}

}  // namespace ztrain
