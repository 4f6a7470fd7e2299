// CpuOps::Dequantize (ops.h; the blob is kernels/quant.h's): bitsandbytes' dequantization,
// parallel over chunks of 4-bit blocks or over INT8 rows. Values are computed in fp32 into the
// output (fp32) or a stack buffer rounded once to bf16 / fp16 by the converters of convert.h.
//
// Built with -ffp-contract=off (kernels/CMakeLists.txt): double quantization's absmax is
// map[code] * scale + offset with the product rounded before the sum, as bitsandbytes computes
// it, which a fused multiply-add would not give.
#include "kernels/cpu/dequantize.h"

// GCC 12's AVX-512 intrinsics start from an undefined operand, which -Wmaybe-uninitialized
// reports at every use (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "kernels/cpu/check.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_ops.h"

namespace ztrain::kernels {
namespace {

constexpr int64_t kChunkBlocks = 16;                        // 4-bit blocks per parallel chunk
constexpr int64_t kChunk = kChunkBlocks * kQuantBlock;       // elements per chunk (and buffer)

float LoadFloat(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Where the absmax of a piece's 4-bit block comes from: the blob's fp32 values, or with double
// quantization map[code] * scale + offset (the scale of the 256 WHOLE blocks holding it).
struct BlockAbsmax {
  BlockAbsmax(const uint8_t* blob, const QuantFormat& format, const QuantGeometry& geometry,
              const QuantLayout& layout)
      : g(geometry), double_quant(format.double_quant), absmax(blob + layout.absmax),
        codes(blob + layout.absmax_codes), scales(blob + layout.scales) {
    if (double_quant) offset = LoadFloat(scales + layout.scales_bytes - 4);  // after the scales
  }
  float operator()(int64_t b) const {
    if (!double_quant) return LoadFloat(absmax + b * 4);
    const float scale = LoadFloat(scales + g.WholeBlock(b) / kDoubleQuantBlock * 4);
    const float product = map[codes[b]] * scale;
    return product + offset;
  }

  QuantGeometry g;
  bool double_quant;
  const uint8_t *absmax, *codes, *scales;
  float offset = 0.0f;
  const std::array<float, 256>& map = DynamicMap();
};

void Dequantize4Bit(const uint8_t* blob, const QuantFormat& format, const QuantGeometry& g,
                    const QuantLayout& layout, const Tensor& out) {
  const float* lut = Codebook(format.type).data();
  const int64_t n = g.rows * g.cols, blocks = g.Blocks();
  const int64_t chunks = (blocks + kChunkBlocks - 1) / kChunkBlocks;
  const DType dtype = out.dtype();
  const size_t elem = DTypeSize(dtype);
  auto* dst = static_cast<char*>(out.data());
  const BlockAbsmax absmax(blob, format, g, layout);
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) {
    float buf[kChunk];
    const int64_t first = c * kChunkBlocks, last = std::min(blocks, first + kChunkBlocks);
    const int64_t begin = first * kQuantBlock, end = std::min(n, last * kQuantBlock);
    float* values = dtype == DType::kF32 ? reinterpret_cast<float*>(dst) + begin : buf;
    for (int64_t b = first; b < last; ++b) {
      const int64_t at = b * kQuantBlock;
      cpu::DecodeNibbles(blob + layout.codes + at / 2, std::min(kQuantBlock, n - at), lut,
                         absmax(b), values + (at - begin));
    }
    if (dtype != DType::kF32) cpu::NarrowSerial(buf, dst + begin * elem, dtype, end - begin);
  }
}

// x' = (code * row_absmax) * fp32(1/127), two fp32 products (int8_vectorwise_dequant).
void DequantizeInt8(const uint8_t* blob, const QuantGeometry& g, const QuantLayout& layout,
                    const Tensor& out) {
  const auto* codes = reinterpret_cast<const int8_t*>(blob + layout.codes);
  const DType dtype = out.dtype();
  const size_t elem = DTypeSize(dtype);
  auto* dst = static_cast<char*>(out.data());
#pragma omp parallel for schedule(static) if (g.rows * g.cols >= cpu::kParallelGrain)
  for (int64_t r = 0; r < g.rows; ++r) {
    float buf[kChunk];
    const float absmax = LoadFloat(blob + layout.absmax + r * 4);
    for (int64_t c0 = 0; c0 < g.cols; c0 += kChunk) {
      const int64_t at = r * g.cols + c0, len = std::min(kChunk, g.cols - c0);
      float* values = dtype == DType::kF32 ? reinterpret_cast<float*>(dst) + at : buf;
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) {
        values[i] = (static_cast<float>(codes[at + i]) * absmax) * kInt8DequantScale;
      }
      if (dtype != DType::kF32) cpu::NarrowSerial(buf, dst + at * elem, dtype, len);
    }
  }
}

}  // namespace

namespace cpu {

void DecodeNibblesScalar(const uint8_t* packed, int64_t n, const float* lut, float absmax,
                         float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t byte = packed[i / 2];
    out[i] = lut[i % 2 == 0 ? byte >> 4 : byte & 0x0f] * absmax;
  }
}

#ifdef __AVX512F__
// 16 values from 8 bytes: each byte doubled (b0 b0 b1 b1 ...), widened to 32-bit lanes and
// shifted right by 4 in the even lanes (the high nibble: the pair's first element). VPERMPS
// reads only an index's low 4 bits, so the odd lanes need no mask.
void DecodeNibbles(const uint8_t* packed, int64_t n, const float* lut, float absmax, float* out) {
  const __m512 table = _mm512_loadu_ps(lut);
  const __m512 scale = _mm512_set1_ps(absmax);
  const __m512i shifts = _mm512_set_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed + i / 2));
    const __m512i codes =
        _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, bytes)), shifts);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_permutexvar_ps(codes, table), scale));
  }
  DecodeNibblesScalar(packed + i / 2, n - i, lut, absmax, out + i);
}
#else
void DecodeNibbles(const uint8_t* packed, int64_t n, const float* lut, float absmax, float* out) {
  DecodeNibblesScalar(packed, n, lut, absmax, out);
}
#endif

}  // namespace cpu

void CpuOps::Dequantize(const Tensor& blob, const QuantFormat& format,
                        const QuantGeometry& geometry, const Tensor& out) {
  constexpr const char* kOp = "Dequantize";
  CheckQuant(format, geometry, kOp);
  const QuantLayout layout = LayoutOf(format, geometry);
  cpu::CheckCount(blob, layout.total, kOp, "blob", DType::kU8);
  cpu::CheckCpuFloat(out, {geometry.rows, geometry.cols}, kOp, "out");
  const auto* bytes = static_cast<const uint8_t*>(blob.data());
  if (format.type == QuantType::kInt8) {
    DequantizeInt8(bytes, geometry, layout, out);
  } else {
    Dequantize4Bit(bytes, format, geometry, layout, out);
  }
}

}  // namespace ztrain::kernels
