#pragma once
// Bulk conversions between the floating-point dtypes (fp32, bf16, fp16) for the CPU kernels.
//
// Results are bitwise those of core/dtype.h's scalar conversions: narrowing rounds to
// nearest, ties to even, keeps subnormals (bf16 from fp32 subnormals, fp16 subnormals), turns
// fp16 overflow into infinity and NaN into the same NaN the scalar code gives; widening is
// exact. The AVX-512 paths are chosen at run time (VCVTNEPS2BF16 with AVX512-BF16, VCVTPS2PH
// and VCVTPH2PS with AVX512F), the scalar loops otherwise. The hardware bf16 conversion
// flushes fp32 subnormals to zero, so vectors holding one take the integer path instead.
// Pure functions on caller memory; the parallel ones run an OpenMP loop, the *Serial ones
// run on the calling thread (for use inside a parallel region).
#include <cstdint>

#include "core/dtype.h"

namespace ztrain::kernels::cpu {

// True for bf16 and fp16.
inline bool IsHalfType(DType t) { return t == DType::kBF16 || t == DType::kF16; }
// True for fp32, bf16 and fp16.
inline bool IsFloatType(DType t) { return t == DType::kF32 || IsHalfType(t); }

// dst[i] = src[i] widened to fp32 (src of any float dtype; fp32 is copied).
void WidenSerial(const void* src, DType src_type, float* dst, int64_t n);
void Widen(const void* src, DType src_type, float* dst, int64_t n);

// dst[i] = src[i] rounded to dst_type (any float dtype; fp32 is copied).
void NarrowSerial(const float* src, void* dst, DType dst_type, int64_t n);
void Narrow(const float* src, void* dst, DType dst_type, int64_t n);

// dst = src between any two float dtypes: bytes when the dtypes match, otherwise widened to
// fp32 and rounded once to dst_type. src and dst must not overlap unless they are equal.
void ConvertFloat(const void* src, DType src_type, void* dst, DType dst_type, int64_t n);

}  // namespace ztrain::kernels::cpu
