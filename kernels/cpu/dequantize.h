#pragma once
// The inner loop of CpuOps::Dequantize for 4-bit blocks (kernels/cpu/dequantize.cc), declared
// here for its test: the AVX-512 loop and the portable one give the same bits.
#include <cstdint>

namespace ztrain::kernels::cpu {

// out[i] = lut[code i] * absmax (one fp32 product) for the n codes packed two a byte at
// `packed`, the first of a pair in the high nibble. The AVX-512 loop where the build has it.
void DecodeNibbles(const uint8_t* packed, int64_t n, const float* lut, float absmax, float* out);
// The same, one element at a time, in any build.
void DecodeNibblesScalar(const uint8_t* packed, int64_t n, const float* lut, float absmax,
                         float* out);

}  // namespace ztrain::kernels::cpu
