#pragma once
// Element types and their conversions.
//
// fp32 is the reference type. bf16 and fp16 are stored as raw 16-bit patterns; conversions
// from fp32 round to nearest, ties to even (as IEEE 754 and the hardware do), keep NaN a NaN,
// and fp16 overflows to infinity and produces subnormals below 2^-14. Pure functions, thread
// safe.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace ztrain {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kU16, kU8 };

size_t DTypeSize(DType t);
std::string_view DTypeName(DType t);
// Parses "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16", "int32", "uint16", "uint8".
DType ParseDType(std::string_view name);

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}
inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);

// Bulk conversions between fp32 and a 16-bit type (kBF16 or kF16). OpenMP-parallel.
void ConvertFromFloat(const float* src, void* dst, DType dst_type, size_t n);
void ConvertToFloat(const void* src, DType src_type, float* dst, size_t n);

}  // namespace ztrain
