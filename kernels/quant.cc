// kernels/quant.h on the host: the blob layout, its checks, the code tables, and QuantizeInto,
// bitsandbytes' quantization as tests/reference/bnb_quant.py specifies it bit for bit.
//
// Built with -ffp-contract=off (kernels/CMakeLists.txt): every product and sum here is its
// own fp32 rounding, as in bitsandbytes' kernels. OpenMP over blocks (4-bit) or rows (INT8);
// the only sum, double quantization's mean, runs in a fixed order, so the blob is the same
// whatever the number of threads.
#include "kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/convert.h"

namespace ztrain::kernels {
namespace {

// dQuantizeNF4's thresholds in ascending order; the code is the number of them that the scaled
// value exceeds, so a value exactly on one goes to the lower code. Rounded to fp32 from the
// double values, as bnb_quant.py reads them: each is then the fp32 midpoint of two neighbouring
// codebook values. (Rounded straight from the decimal digits, as the f-suffixed literals of
// bitsandbytes' kernel are, entries 0, 8, 12 and 14 would come out one fp32 step away.)
constexpr float kNf4Thresholds[15] = {
    static_cast<float>(-0.8480964004993439),  static_cast<float>(-0.6106329262256622),
    static_cast<float>(-0.4599952697753906),  static_cast<float>(-0.33967943489551544),
    static_cast<float>(-0.23460740596055984), static_cast<float>(-0.13791173323988914),
    static_cast<float>(-0.045525018125772476), static_cast<float>(0.03979014977812767),
    static_cast<float>(0.1202552504837513),   static_cast<float>(0.2035212516784668),
    static_cast<float>(0.2920137718319893),   static_cast<float>(0.3893125355243683),
    static_cast<float>(0.5016634166240692),   static_cast<float>(0.6427869200706482),
    static_cast<float>(0.8614784181118011)};
// dQuantizeFP4's thresholds on |s|, ascending (none of them is a midpoint: bnb_quant.py).
constexpr float kFp4Thresholds[7] = {0.00260417f, 0.0859375f, 0.20833333f, 0.29166667f,
                                     0.4166667f,  0.583333f,  0.8333333f};

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;  // |x|'s bits at or above it: inf or NaN

int64_t Align4(int64_t bytes) { return (bytes + 3) / 4 * 4; }

// max |x[i]| as bits: non-negative floats order as their bit patterns, and an integer max
// vectorises without NaN rules. >= kInfBits when some x[i] is inf or NaN.
uint32_t AbsMaxBits(const float* x, int64_t n) {
  uint32_t m = 0;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, FloatBits(x[i]) & kAbsMask);
  return m;
}

// The 4-bit code of a scaled value (NaN, from an all-zero block's 0 * inf, gives code 0).
uint8_t Nf4Code(float s) {
  int code = 0;
  for (float t : kNf4Thresholds) code += s > t;
  return static_cast<uint8_t>(code);
}
uint8_t Fp4Code(float s) {
  const float a = std::fabs(s);
  int k = 0;
  for (float t : kFp4Thresholds) k += a > t;
  // The tree's magnitude codes for k = 0..7 are 000 001 110 111 100 101 010 011: k with bit 2
  // flipped where bit 1 is set.
  const int magnitude = k ^ ((k & 2) << 1);
  return static_cast<uint8_t>((s < 0.0f ? 0b1000 : 0) | magnitude);
}

// Packs n codes (n even) two a byte, the first of a pair in the high nibble.
void PackCodes(const uint8_t* codes, int64_t n, uint8_t* packed) {
  for (int64_t j = 0; j < n / 2; ++j) {
    packed[j] = static_cast<uint8_t>(codes[2 * j] << 4 | codes[2 * j + 1]);
  }
}

// kQuantizeBlockwise on one block of n <= 64 elements: writes ceil(n / 2) packed bytes and
// returns the block's absmax (not finite when the block holds inf or NaN).
float QuantizeBlock(QuantType type, const float* x, int64_t n, uint8_t* packed) {
  const float absmax = BitsToFloat(AbsMaxBits(x, n));
  const float inv = 1.0f / absmax;  // +inf for an all-zero block
  uint8_t codes[kQuantBlock + 1];
  if (type == QuantType::kNf4) {
    for (int64_t i = 0; i < n; ++i) codes[i] = Nf4Code(x[i] * inv);
  } else {
    for (int64_t i = 0; i < n; ++i) codes[i] = Fp4Code(x[i] * inv);
  }
  if (n % 2 != 0) {  // the kernel loads 0 for the missing element of the last pair
    codes[n] = type == QuantType::kNf4 ? Nf4Code(0.0f * inv) : Fp4Code(0.0f * inv);
  }
  PackCodes(codes, n + n % 2, packed);
  return absmax;
}

// Where the piece's block `b` lies in `whole`, and its length: 64 elements in one row of a
// piece; for all of W, the flattened W cut in 64s (the last one maybe short).
const float* BlockSource(const QuantGeometry& g, const float* whole, int64_t b, int64_t* n) {
  if (g.IsWhole()) {
    *n = std::min(kQuantBlock, g.rows * g.cols - b * kQuantBlock);
    return whole + b * kQuantBlock;
  }
  const int64_t per_row = g.cols / kQuantBlock;
  *n = kQuantBlock;
  return whole + g.WholeRow(b / per_row) * g.whole_cols + g.col_offset +
         b % per_row * kQuantBlock;
}

// The absmax of every block of W (flattened, cut in 64s); false when one is not finite.
bool WholeAbsmax(const QuantGeometry& g, const float* whole, std::vector<float>* absmax) {
  const int64_t n = g.whole_rows * g.whole_cols, blocks = g.WholeBlocks();
  absmax->resize(blocks);
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite) if (n >= cpu::kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    const uint32_t bits =
        AbsMaxBits(whole + b * kQuantBlock, std::min(kQuantBlock, n - b * kQuantBlock));
    (*absmax)[b] = BitsToFloat(bits);
    finite = finite && bits < kInfBits;
  }
  return finite;
}

// The float64 mean of v rounded to fp32, summed in chunks of a fixed size and the chunks in
// order: the same bits for any number of threads.
float Mean(const std::vector<float>& v) {
  constexpr int64_t kChunk = 4096;
  const int64_t n = static_cast<int64_t>(v.size()), chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0.0;
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) s += v[i];
    partial[c] = s;
  }
  double sum = 0.0;
  for (double s : partial) sum += s;
  return static_cast<float>(sum / static_cast<double>(n));
}

// dQuantize<0>: a 7-step binary search over the sorted map from pivot 127, then the nearer of
// the value it stopped on and the bracketing neighbour by their fp32 midpoint (a value on the
// midpoint keeps the stopping code). NaN compares false throughout and ends on code 0.
uint8_t DynamicCode(const std::array<float, 256>& map, float x) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f, val = map[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = map[pivot];
  }
  if (upper_pivot == 255) upper = map[255];
  if (lower_pivot == 0) lower = map[0];
  if (x > val) return static_cast<uint8_t>(x > (upper + val) * 0.5f ? upper_pivot : pivot);
  return static_cast<uint8_t>(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

// Double quantization of the whole tensor's absmax: the local blocks' 8-bit codes, then the
// scales of every 256-block of W and the offset (QuantLayout's sections).
void DoubleQuantize(const QuantGeometry& g, const std::vector<float>& whole_absmax,
                    const QuantLayout& layout, uint8_t* blob) {
  const float offset = Mean(whole_absmax);
  const int64_t nb = static_cast<int64_t>(whole_absmax.size());
  const int64_t n_scales = (nb + kDoubleQuantBlock - 1) / kDoubleQuantBlock;
  std::vector<float> scales(n_scales + 1);
  for (int64_t s = 0; s < n_scales; ++s) {
    float m = 0.0f;
    for (int64_t i = s * kDoubleQuantBlock; i < std::min(nb, (s + 1) * kDoubleQuantBlock); ++i) {
      m = std::max(m, std::fabs(whole_absmax[i] - offset));
    }
    scales[s] = m;
  }
  scales[n_scales] = offset;
  const std::array<float, 256>& map = DynamicMap();
  const int64_t blocks = g.Blocks();
  uint8_t* codes = blob + layout.absmax_codes;
#pragma omp parallel for schedule(static) if (blocks >= cpu::kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t wb = g.WholeBlock(b);
    const float inv = 1.0f / scales[wb / kDoubleQuantBlock];
    codes[b] = DynamicCode(map, (whole_absmax[wb] - offset) * inv);
  }
  std::memcpy(blob + layout.scales, scales.data(), scales.size() * sizeof(float));
}

void Quantize4Bit(const QuantFormat& format, const QuantGeometry& g, const QuantLayout& layout,
                  const float* whole, uint8_t* blob) {
  const int64_t blocks = g.Blocks();
  std::vector<float> absmax(blocks);
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite) \
    if (blocks * kQuantBlock >= cpu::kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t n = 0;
    const float* src = BlockSource(g, whole, b, &n);
    absmax[b] = QuantizeBlock(format.type, src, n, blob + layout.codes + b * kQuantBlock / 2);
    finite = finite && std::isfinite(absmax[b]);
  }
  ZTRAIN_CHECK(finite, "QuantizeInto: the weight holds inf or NaN; bitsandbytes' absmax of its "
               "block would not be finite");
  if (!format.double_quant) {
    std::memcpy(blob + layout.absmax, absmax.data(), absmax.size() * sizeof(float));
    return;
  }
  std::vector<float> whole_absmax;
  if (g.IsWhole()) {
    whole_absmax = std::move(absmax);
  } else {
    ZTRAIN_CHECK(WholeAbsmax(g, whole, &whole_absmax), "QuantizeInto: the whole weight ",
                 g.whole_rows, " x ", g.whole_cols, " holds inf or NaN outside this piece; "
                 "double quantization's absmax mean would not be finite");
  }
  DoubleQuantize(g, whole_absmax, layout, blob);
}

// LLM.int8's row-wise codes of n values of one row whose (fp16) absmax is `absmax`:
// round_half_even(fp16(x) * fp32(127 / absmax)), 0 for an all-zero row.
void QuantizeInt8Row(const float* x, int64_t n, float absmax, int8_t* codes) {
  constexpr int64_t kChunk = 256;
  const float scale = 127.0f / absmax;
  uint16_t half[kChunk];
  float x16[kChunk];
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t len = std::min(kChunk, n - c0);
    cpu::NarrowSerial(x + c0, half, DType::kF16, len);
    cpu::WidenSerial(half, DType::kF16, x16, len);
    for (int64_t i = 0; i < len; ++i) {
      codes[c0 + i] =
          absmax > 0.0f ? static_cast<int8_t>(std::nearbyint(x16[i] * scale)) : int8_t{0};
    }
  }
}

void QuantizeInt8(const QuantGeometry& g, const QuantLayout& layout, const float* whole,
                  uint8_t* blob) {
  std::vector<float> absmax(g.rows);
  auto* codes = reinterpret_cast<int8_t*>(blob + layout.codes);
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite) \
    if (g.rows * g.whole_cols >= cpu::kParallelGrain)
  for (int64_t r = 0; r < g.rows; ++r) {
    const float* row = whole + g.WholeRow(r) * g.whole_cols;
    // fp16 rounding is monotone and odd, so the row's fp16 absmax is its fp32 absmax rounded.
    const uint32_t bits = AbsMaxBits(row, g.whole_cols);
    absmax[r] = bits < kInfBits ? HalfToFloat(FloatToHalf(BitsToFloat(bits)))
                                : std::numeric_limits<float>::infinity();
    if (!std::isfinite(absmax[r])) {
      finite = false;
      continue;
    }
    QuantizeInt8Row(row + g.col_offset, g.cols, absmax[r], codes + r * g.cols);
  }
  ZTRAIN_CHECK(finite, "QuantizeInto: the weight holds inf, NaN or a value beyond fp16's range "
               "(65504); bitsandbytes converts INT8 weights to fp16 first");
  std::memcpy(blob + layout.absmax, absmax.data(), absmax.size() * sizeof(float));
}

// The sections of LayoutOf, the arguments checked.
QuantLayout Layout(const QuantFormat& format, const QuantGeometry& g) {
  QuantLayout l;
  int64_t at = 0;
  const auto section = [&at](int64_t bytes, int64_t* offset, int64_t* size) {
    *offset = at;
    *size = bytes;
    at = Align4(at + bytes);
  };
  const int64_t n = g.rows * g.cols;
  if (format.type == QuantType::kInt8) {
    section(n, &l.codes, &l.codes_bytes);
    section(g.rows * int64_t{sizeof(float)}, &l.absmax, &l.absmax_bytes);
  } else {
    section((n + 1) / 2, &l.codes, &l.codes_bytes);
    const int64_t n_scales = (g.WholeBlocks() + kDoubleQuantBlock - 1) / kDoubleQuantBlock;
    const bool dq = format.double_quant;
    section(dq ? 0 : g.Blocks() * int64_t{sizeof(float)}, &l.absmax, &l.absmax_bytes);
    section(dq ? g.Blocks() : 0, &l.absmax_codes, &l.absmax_codes_bytes);
    section(dq ? (n_scales + 1) * int64_t{sizeof(float)} : 0, &l.scales, &l.scales_bytes);
  }
  l.total = at;
  return l;
}

// create_dynamic_map's torch.linspace(0.1, 1, k) as bnb_quant.py pins it: point j is
// start + j step below k / 2 and end - (k - 1 - j) step from there, each rounded once (a fused
// multiply-add), step = fp32(fp32(end - start) / (k - 1)).
std::vector<float> Linspace(int k) {
  const float start = static_cast<float>(0.1), end = 1.0f;
  const float step = (end - start) / static_cast<float>(k - 1);
  std::vector<float> points(k);
  for (int j = 0; j < k; ++j) {
    points[j] = j < k / 2 ? std::fma(step, static_cast<float>(j), start)
                          : std::fma(-step, static_cast<float>(k - 1 - j), end);
  }
  return points;
}

std::array<float, 256> BuildDynamicMap() {
  // 10^(i - 6) as Python computes it (a double), then rounded to fp32 by torch's multiply.
  constexpr double kPowers[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const std::vector<float> b = Linspace((1 << i) + 1);
    const float scale = static_cast<float>(kPowers[i]);
    for (size_t j = 0; j + 1 < b.size(); ++j) {
      const float mean = (b[j] + b[j + 1]) / 2.0f;
      data.push_back(scale * mean);
      data.push_back(-scale * mean);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  ZTRAIN_ASSERT(data.size() == 256, "the dynamic map has ", data.size(), " values");
  std::sort(data.begin(), data.end());
  std::array<float, 256> map;
  std::copy(data.begin(), data.end(), map.begin());
  return map;
}

const char* TypeName(QuantType type) {
  switch (type) {
    case QuantType::kNf4:
      return "nf4";
    case QuantType::kFp4:
      return "fp4";
    case QuantType::kInt8:
      return "int8";
    default:
      return "none";
  }
}

}  // namespace

void CheckQuant(const QuantFormat& format, const QuantGeometry& g, const char* op) {
  ZTRAIN_CHECK(format.type != QuantType::kNone, op,
               ": the quantization type is none; pass nf4, fp4 or int8");
  ZTRAIN_CHECK(format.four_bit() || !format.double_quant, op, ": double quantization applies "
               "to nf4 and fp4 only, not to ", TypeName(format.type));
  ZTRAIN_CHECK(g.whole_rows > 0 && g.whole_cols > 0 && g.rows > 0 && g.cols > 0, op,
               ": the weight is ", g.whole_rows, " x ", g.whole_cols, " and the piece ", g.rows,
               " x ", g.cols, "; bitsandbytes cannot quantize an empty tensor");
  ZTRAIN_CHECK(g.group_rows > 0 && g.whole_group_rows > 0 && g.rows % g.group_rows == 0 &&
                   g.whole_rows % g.whole_group_rows == 0 &&
                   g.rows / g.group_rows == g.whole_rows / g.whole_group_rows,
               op, ": the piece's ", g.rows, " rows in groups of ", g.group_rows,
               " do not match the weight's ", g.whole_rows, " rows in groups of ",
               g.whole_group_rows, " (as many groups of each, each group whole)");
  ZTRAIN_CHECK(g.row_offset >= 0 && g.row_offset + g.group_rows <= g.whole_group_rows, op,
               ": rows [", g.row_offset, ", ", g.row_offset + g.group_rows,
               ") of each group lie outside the weight's groups of ", g.whole_group_rows);
  ZTRAIN_CHECK(g.col_offset >= 0 && g.col_offset + g.cols <= g.whole_cols, op, ": columns [",
               g.col_offset, ", ", g.col_offset + g.cols, ") lie outside the weight's ",
               g.whole_cols);
  ZTRAIN_CHECK(!format.four_bit() || g.IsWhole() ||
                   (g.whole_cols % kQuantBlock == 0 && g.cols % kQuantBlock == 0 &&
                    g.col_offset % kQuantBlock == 0),
               op, ": a ", TypeName(format.type), " piece [", g.rows, ", ", g.cols,
               "] at column ", g.col_offset, " of a [", g.whole_rows, ", ", g.whole_cols,
               "] weight needs the weight's columns, the piece's columns and its first column "
               "to be multiples of ", kQuantBlock, " (bitsandbytes' block), so that every "
               "block lies in one row of one piece; split the weight another way or keep it "
               "whole");
}

QuantLayout LayoutOf(const QuantFormat& format, const QuantGeometry& geometry) {
  CheckQuant(format, geometry, "LayoutOf");
  return Layout(format, geometry);
}

void QuantizeInto(const QuantFormat& format, const QuantGeometry& geometry, const float* whole,
                  uint8_t* blob) {
  CheckQuant(format, geometry, "QuantizeInto");
  const QuantLayout layout = Layout(format, geometry);
  std::memset(blob, 0, static_cast<size_t>(layout.total));  // the alignment padding
  if (format.type == QuantType::kInt8) {
    QuantizeInt8(geometry, layout, whole, blob);
  } else {
    Quantize4Bit(format, geometry, layout, whole, blob);
  }
}

const std::array<float, 16>& Codebook(QuantType type) {
  static const std::array<float, 16> kNf4 = {
      -1.0f,
      static_cast<float>(-0.6961928009986877),
      static_cast<float>(-0.5250730514526367),
      static_cast<float>(-0.39491748809814453),
      static_cast<float>(-0.28444138169288635),
      static_cast<float>(-0.18477343022823334),
      static_cast<float>(-0.09105003625154495),
      0.0f,
      static_cast<float>(0.07958029955625534),
      static_cast<float>(0.16093020141124725),
      static_cast<float>(0.24611230194568634),
      static_cast<float>(0.33791524171829224),
      static_cast<float>(0.44070982933044434),
      static_cast<float>(0.5626170039176941),
      static_cast<float>(0.7229568362236023),
      1.0f};
  // fp4_dequantization_lut by the three magnitude bits, negated for the sign bit 0b1000.
  static const std::array<float, 16> kFp4 = {
      0.0f,   0.005208333333f,  0.66666667f,  1.0f,  0.33333333f,  0.5f,  0.16666667f,  0.25f,
      -0.0f, -0.005208333333f, -0.66666667f, -1.0f, -0.33333333f, -0.5f, -0.16666667f, -0.25f};
  ZTRAIN_ASSERT(type == QuantType::kNf4 || type == QuantType::kFp4, "Codebook of ",
                TypeName(type));
  return type == QuantType::kNf4 ? kNf4 : kFp4;
}

const std::array<float, 256>& DynamicMap() {
  static const std::array<float, 256> kMap = BuildDynamicMap();
  return kMap;
}

}  // namespace ztrain::kernels
