#pragma once
// Quantized frozen weights, as bitsandbytes stores them (QLoRA's base: Note [Quantized
// parameters] in nn/adapters.h): 4-bit NF4 or FP4 in blocks of 64 consecutive elements with
// an fp32 absmax per block (or, with double quantization, the absmax values less their mean
// in 8-bit blocks of 256), and INT8 with an fp32 absmax per row.
//
// A weight W [whole_rows, whole_cols] is quantized whole, exactly as bitsandbytes quantizes
// it (the same codes, absmax and double-quantized statistics), and each process keeps the
// blob of the piece it holds (QuantGeometry: all of W, or its tensor-parallel slice). The
// piece's blob dequantizes to exactly the values the whole tensor's quantization gives those
// elements, so every layout computes with the same weights. The whole-tensor statistics a
// piece needs (the double-quantized absmax scales, a few bytes per 16384 elements, and their
// offset) are kept whole in every piece's blob.
//
// The algorithms, bit for bit, are those tests/reference/bnb_quant.py specifies (its
// docstring cites bitsandbytes' kernels); tests/kernels/quant_test.cc holds the two together.
//
// Requirements (CheckQuant; ConfigError naming the weight from the callers that check them
// first): a non-empty weight and a well-formed geometry; for a 4-bit piece that is not all of
// W, whole_cols, cols and col_offset multiples of 64 (every block lies in one row of one
// piece). All of W takes any shape: its last block may be short, as bitsandbytes' is.
// Pure functions of their arguments; thread safe.
#include <array>
#include <cstdint>

// Functions of QuantGeometry that the CUDA kernels call too.
#if defined(__CUDACC__)
#define ZTRAIN_HOST_DEVICE __host__ __device__
#else
#define ZTRAIN_HOST_DEVICE
#endif

namespace ztrain::kernels {

enum class QuantType : uint8_t { kNone, kNf4, kFp4, kInt8 };

struct QuantFormat {
  QuantType type = QuantType::kNone;
  bool double_quant = false;  // 4-bit only: bnb_4bit_use_double_quant
  bool four_bit() const { return type == QuantType::kNf4 || type == QuantType::kFp4; }
};

inline constexpr int64_t kQuantBlock = 64;         // elements per 4-bit block (bnb's blocksize)
inline constexpr int64_t kDoubleQuantBlock = 256;  // absmax values per 8-bit block
// int8_vectorwise_dequant's constant, fp32(1 / 127).
inline constexpr float kInt8DequantScale = 7.874015718698502e-3f;

// A [rows, cols] piece of the whole weight [whole_rows, whole_cols], both row-major. Local
// row r is whole row (r / group_rows) * whole_group_rows + row_offset + r % group_rows;
// local column c is whole column col_offset + c. All of W: group_rows = whole_group_rows =
// rows, offsets 0. A column-parallel slice (rows split, `groups` blocks of rows such as a
// fused q/k/v): group_rows = rows / groups, whole_group_rows = whole_rows / groups,
// row_offset = part * group_rows. A row-parallel slice (columns split): rows whole,
// col_offset = part * cols.
struct QuantGeometry {
  int64_t rows = 0, cols = 0;
  int64_t whole_rows = 0, whole_cols = 0;
  int64_t group_rows = 0, whole_group_rows = 0, row_offset = 0, col_offset = 0;
  // All of a [rows, cols] weight.
  static QuantGeometry Whole(int64_t rows, int64_t cols) {
    return {rows, cols, rows, cols, rows, rows, 0, 0};
  }
  ZTRAIN_HOST_DEVICE bool IsWhole() const {
    return rows == whole_rows && cols == whole_cols && row_offset == 0 && col_offset == 0;
  }
  ZTRAIN_HOST_DEVICE int64_t WholeRow(int64_t r) const {
    return (r / group_rows) * whole_group_rows + row_offset + r % group_rows;
  }
  // 4-bit: the whole tensor's block (64 consecutive elements of W flattened) that holds the
  // piece's block `block` (64 consecutive elements of the piece flattened).
  ZTRAIN_HOST_DEVICE int64_t WholeBlock(int64_t block) const {
    if (IsWhole()) return block;
    const int64_t per_row = cols / kQuantBlock;
    return WholeRow(block / per_row) * (whole_cols / kQuantBlock) + col_offset / kQuantBlock +
           block % per_row;
  }
  // 4-bit blocks of the piece (the last one may be short for all of W) and of W.
  ZTRAIN_HOST_DEVICE int64_t Blocks() const {
    return (rows * cols + kQuantBlock - 1) / kQuantBlock;
  }
  ZTRAIN_HOST_DEVICE int64_t WholeBlocks() const {
    return (whole_rows * whole_cols + kQuantBlock - 1) / kQuantBlock;
  }
};

// The sections of a piece's blob, in bytes from its start, each at a 4-byte aligned offset:
//   codes         4-bit: ceil(rows cols / 2) bytes, two codes a byte, the first element of a
//                 pair in the high nibble (bitsandbytes' packing; an odd count pads the last
//                 low nibble as bitsandbytes does); INT8: rows cols int8
//   absmax        fp32: one per local 64-block (4-bit without double quantization), or one per
//                 local row (INT8: its whole row's absmax)
//   absmax_codes  double quantization: one byte per local block
//   scales        double quantization: fp32, one per 256 WHOLE blocks (the whole tensor's),
//                 then one fp32 more: the offset (the mean of the whole tensor's absmax)
// Sections a format does not use have 0 bytes.
struct QuantLayout {
  int64_t codes = 0, codes_bytes = 0;
  int64_t absmax = 0, absmax_bytes = 0;
  int64_t absmax_codes = 0, absmax_codes_bytes = 0;
  int64_t scales = 0, scales_bytes = 0;
  int64_t total = 0;  // a multiple of 4
};
// CheckQuant(format, geometry, "LayoutOf"), then the layout.
QuantLayout LayoutOf(const QuantFormat& format, const QuantGeometry& geometry);

// Throws ztrain::Error, its message starting with "<op>: ", unless `format` is a quantized
// type (double quantization only for 4-bit) and `geometry` a piece the functions here take
// (the requirements at the top).
void CheckQuant(const QuantFormat& format, const QuantGeometry& geometry, const char* op);

// Host: the blob of `geometry`'s piece (LayoutOf(...).total bytes at `blob`, any alignment)
// from the WHOLE weight `whole` (fp32, [whole_rows, whole_cols]), quantized as bitsandbytes
// quantizes it. Deterministic (whatever the number of OpenMP threads) and bitwise independent
// of the geometry for what it stores. Reads the piece's elements (4-bit; INT8: the piece's
// whole rows), and with double quantization all of W; throws ztrain::Error when a value it
// reads is inf or NaN, or (INT8) overflows fp16, which bitsandbytes converts the weight to.
void QuantizeInto(const QuantFormat& format, const QuantGeometry& geometry, const float* whole,
                  uint8_t* blob);

// The values of the 16 4-bit codes (bitsandbytes' nf4 / fp4 dequantization LUTs; FP4 code
// 0b1000 is -0.0).
const std::array<float, 16>& Codebook(QuantType type);
// The values of double quantization's 8-bit codes: bitsandbytes' create_dynamic_map(signed,
// 7 exponent bits, 8 bits), sorted, with its linspace pinned as bnb_quant.py pins it.
const std::array<float, 256>& DynamicMap();

}  // namespace ztrain::kernels
