// kernels/quant.h and CpuOps::Dequantize against bitsandbytes' algorithm: the blob's codes,
// absmax and double-quantized statistics equal tests/reference/bnb_quant.py's byte for byte,
// and the dequantized values its values bit for bit (nf4, fp4, each with and without double
// quantization, int8), on odd sizes, all-zero blocks, more than 256 blocks and values exactly on
// the decision thresholds. Then what the reference cannot see: a tensor-parallel piece's blob
// dequantizes to the whole tensor's values at its elements; double quantization's absmax stays
// within its stated bound; bf16 / fp16 outputs are the fp32 values rounded once; the bits do not
// depend on the thread count; the AVX-512 nibble decoder equals the scalar one; bad input is
// refused by name.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/quant.h"
#include "nn/safetensors.h"

namespace ztrain::kernels {
namespace {

namespace fs = std::filesystem;

struct Weight {
  std::string name;
  int64_t rows, cols;
  std::vector<float> values;
};

std::vector<float> Normal(int64_t n, uint32_t seed, float stddev) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

// Thresholds a 4-bit tree decides on, as fp32, with the codebook values themselves: a block
// whose absmax is 1 puts each scaled value exactly on them.
std::vector<float> Ties() {
  std::vector<float> v = {1.0f};
  const std::vector<double> nf4_thresholds = {
      -0.8480964004993439,  -0.6106329262256622,   -0.4599952697753906,  -0.33967943489551544,
      -0.23460740596055984, -0.13791173323988914,  -0.045525018125772476, 0.03979014977812767,
      0.1202552504837513,   0.2035212516784668,    0.2920137718319893,   0.3893125355243683,
      0.5016634166240692,   0.6427869200706482,    0.8614784181118011};
  for (double t : nf4_thresholds) v.push_back(static_cast<float>(t));
  for (float t : {0.00260417f, 0.0859375f, 0.20833333f, 0.29166667f, 0.4166667f, 0.583333f,
                  0.8333333f}) {
    v.push_back(t);
    v.push_back(-t);
  }
  for (float c : Codebook(QuantType::kNf4)) v.push_back(c);
  v.push_back(-0.0f);
  v.resize(128, 0.5f);
  return v;
}

// The reference's test tensors: odd counts, short last blocks, all-zero blocks, more than 256
// (and 512) blocks, ties on the thresholds, int8 rows whose scaled values land on halves.
std::vector<Weight> Weights() {
  std::vector<Weight> w;
  w.push_back({"normal", 96, 128, Normal(96 * 128, 1, 0.02f)});
  w.push_back({"odd", 7, 13, Normal(7 * 13, 2, 1.0f)});
  w.push_back({"single", 1, 1, {-3.5f}});
  std::vector<float> zeros = Normal(4 * 64, 3, 0.5f);
  std::fill(zeros.begin() + 64, zeros.begin() + 128, 0.0f);
  std::fill(zeros.begin() + 192, zeros.end(), 0.0f);
  w.push_back({"zeros", 4, 64, zeros});
  w.push_back({"many", 600, 64, Normal(600 * 64, 4, 0.05f)});
  std::vector<float> outliers = Normal(3 * 1000, 5, 0.1f);
  outliers[17] = 40.0f;
  outliers[1999] = -65000.0f;  // fp16's range still holds it
  w.push_back({"outliers", 3, 1000, outliers});
  w.push_back({"ties", 2, 64, Ties()});
  // absmax 127: the int8 scale is exactly 1 and x.5 rounds half to even.
  std::vector<float> halves = {127.0f, 0.5f, 1.5f, 2.5f, 3.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f};
  halves.resize(64, 64.5f);
  w.push_back({"halves", 1, 64, halves});
  return w;
}

struct Case {
  const char* name;
  QuantFormat format;
  const char* args;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const Case kCases[] = {
    {"nf4", {QuantType::kNf4, false}, "--type nf4"},
    {"nf4_dq", {QuantType::kNf4, true}, "--type nf4 --double-quant"},
    {"fp4", {QuantType::kFp4, false}, "--type fp4"},
    {"fp4_dq", {QuantType::kFp4, true}, "--type fp4 --double-quant"},
    {"int8", {QuantType::kInt8, false}, "--type int8"},
};

std::vector<uint8_t> Quantize(const QuantFormat& format, const QuantGeometry& g,
                              const std::vector<float>& whole) {
  std::vector<uint8_t> blob(static_cast<size_t>(LayoutOf(format, g).total));
  QuantizeInto(format, g, whole.data(), blob.data());
  return blob;
}

template <typename T>
std::vector<T> Dequantized(std::vector<uint8_t>& blob, const QuantFormat& format,
                           const QuantGeometry& g, DType dtype) {
  CpuOps ops;
  std::vector<T> out(static_cast<size_t>(g.rows * g.cols));
  ops.Dequantize(Tensor(blob.data(), DType::kU8, {static_cast<int64_t>(blob.size())}), format, g,
                 Tensor(out.data(), dtype, {g.rows, g.cols}));
  return out;
}

std::vector<float> DequantizedF32(std::vector<uint8_t>& blob, const QuantFormat& format,
                                  const QuantGeometry& g) {
  return Dequantized<float>(blob, format, g, DType::kF32);
}

// The first index where two byte ranges differ, or -1.
int64_t FirstDifference(const void* a, const void* b, int64_t n) {
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] != y[i]) return i;
  }
  return -1;
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

class QuantReferenceTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    const std::string python = ZTRAIN_TORCH_PYTHON;
    if (python.empty() ||
        std::system((Quote(python) + " -c 'import torch' >/dev/null 2>&1").c_str()) != 0) {
      return;
    }
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("ztrain_quant_test_" + std::to_string(::getpid())));
    fs::create_directories(*dir_);
    weights_ = new std::vector<Weight>(Weights());
    std::vector<nn::SafetensorsTensor> tensors;
    for (const Weight& w : *weights_) {
      tensors.push_back({w.name, "F32", {w.rows, w.cols}, w.values.data(),
                         static_cast<int64_t>(w.values.size() * sizeof(float))});
    }
    nn::WriteSafetensors((*dir_ / "in.safetensors").string(), tensors, {});
    for (const Case& c : kCases) {
      const std::string cmd = Quote(python) + " " +
                              Quote(std::string(ZTRAIN_REFERENCE_DIR) + "/bnb_quant.py") +
                              " quantize --in " + Quote((*dir_ / "in.safetensors").string()) +
                              " --out " + Quote((*dir_ / (std::string(c.name) + ".st")).string()) +
                              " " + c.args;
      if (std::system(cmd.c_str()) != 0) {
        ADD_FAILURE() << "the reference failed: " << cmd;
        return;
      }
    }
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) fs::remove_all(*dir_);
    delete dir_;
    delete weights_;
    dir_ = nullptr;
    weights_ = nullptr;
  }
  void SetUp() override {
    if (weights_ == nullptr) GTEST_SKIP() << "no python3 with torch (Debian's python3-torch)";
  }

  static fs::path* dir_;
  static std::vector<Weight>* weights_;
};
fs::path* QuantReferenceTest::dir_ = nullptr;
std::vector<Weight>* QuantReferenceTest::weights_ = nullptr;

TEST_P(QuantReferenceTest, BlobAndValuesEqualBitsandbytes) {
  const Case& c = GetParam();
  const std::string file = (*dir_ / (std::string(c.name) + ".st")).string();
  const nn::SafetensorsHeader header = nn::ReadSafetensorsHeader(file);
  for (const Weight& w : *weights_) {
    SCOPED_TRACE(std::string(c.name) + " " + w.name);
    const auto ref = [&](const std::string& suffix) {
      return nn::ReadSafetensorsTensor(file, header, w.name + "." + suffix);
    };
    const QuantGeometry g = QuantGeometry::Whole(w.rows, w.cols);
    std::vector<uint8_t> blob = Quantize(c.format, g, w.values);
    const QuantLayout layout = LayoutOf(c.format, g);
    const auto expect_section = [&](int64_t at, int64_t bytes, const std::vector<char>& want,
                                    const char* what) {
      ASSERT_EQ(bytes, static_cast<int64_t>(want.size())) << what;
      EXPECT_EQ(FirstDifference(blob.data() + at, want.data(), bytes), -1) << what;
    };
    expect_section(layout.codes, layout.codes_bytes, ref("codes"), "codes");
    if (c.format.type == QuantType::kInt8) {
      expect_section(layout.absmax, layout.absmax_bytes, ref("row_absmax"), "row absmax");
    } else if (!c.format.double_quant) {
      expect_section(layout.absmax, layout.absmax_bytes, ref("absmax"), "absmax");
    } else {
      expect_section(layout.absmax_codes, layout.absmax_codes_bytes, ref("absmax_codes"),
                     "absmax codes");
      std::vector<char> scales = ref("absmax_scales");
      const std::vector<char> offset = ref("absmax_offset");
      scales.insert(scales.end(), offset.begin(), offset.end());
      expect_section(layout.scales, layout.scales_bytes, scales, "scales and offset");
    }
    const std::vector<float> values = DequantizedF32(blob, c.format, g);
    const std::vector<char> want = ref("dequantized");
    ASSERT_EQ(want.size(), values.size() * sizeof(float));
    const int64_t at = FirstDifference(values.data(), want.data(), static_cast<int64_t>(want.size()));
    EXPECT_EQ(at, -1) << "dequantized element " << at / 4;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantReferenceTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// A piece of W: a column-parallel slice of 3 row groups (a fused q/k/v), part `part` of `tp`,
// or a row-parallel slice of the columns.
QuantGeometry ColumnSlice(int64_t rows, int64_t cols, int64_t groups, int64_t tp, int64_t part) {
  const int64_t group_rows = rows / groups / tp;
  return {rows / tp, cols, rows, cols, group_rows, rows / groups, part * group_rows, 0};
}
QuantGeometry RowSlice(int64_t rows, int64_t cols, int64_t tp, int64_t part) {
  return {rows, cols / tp, rows, cols, rows, rows, 0, part * (cols / tp)};
}

class QuantFormatTest : public ::testing::TestWithParam<Case> {};

TEST_P(QuantFormatTest, APieceDequantizesToTheWholeTensorsValues) {
  const QuantFormat format = GetParam().format;
  // 384 x 256: 1536 blocks of 64, six double-quantization blocks.
  const int64_t rows = 384, cols = 256;
  const std::vector<float> w = Normal(rows * cols, 7, 0.02f);
  const QuantGeometry whole = QuantGeometry::Whole(rows, cols);
  std::vector<uint8_t> whole_blob = Quantize(format, whole, w);
  const std::vector<float> want = DequantizedF32(whole_blob, format, whole);
  std::vector<QuantGeometry> pieces;
  for (int64_t part = 0; part < 2; ++part) {
    pieces.push_back(ColumnSlice(rows, cols, 3, 2, part));
    pieces.push_back(RowSlice(rows, cols, 2, part));
  }
  for (int64_t part = 0; part < 4; ++part) pieces.push_back(RowSlice(rows, cols, 4, part));
  for (const QuantGeometry& g : pieces) {
    SCOPED_TRACE("piece rows " + std::to_string(g.rows) + " cols " + std::to_string(g.cols) +
                 " row_offset " + std::to_string(g.row_offset) + " col_offset " +
                 std::to_string(g.col_offset));
    std::vector<uint8_t> blob = Quantize(format, g, w);
    EXPECT_LT(blob.size(), whole_blob.size());
    const std::vector<float> got = DequantizedF32(blob, format, g);
    int64_t mismatches = 0;
    for (int64_t r = 0; r < g.rows; ++r) {
      const float* expected = want.data() + g.WholeRow(r) * cols + g.col_offset;
      mismatches += FirstDifference(got.data() + r * g.cols, expected, g.cols * 4) != -1;
    }
    EXPECT_EQ(mismatches, 0) << "rows that differ from the whole tensor's";
  }
}

TEST_P(QuantFormatTest, Bf16AndFp16AreTheFp32ValuesRoundedOnce) {
  const QuantFormat format = GetParam().format;
  const int64_t rows = 37, cols = 192;  // odd row count, a short tail after 16-wide vectors
  const std::vector<float> w = Normal(rows * cols, 8, 1.0f);
  const QuantGeometry g = QuantGeometry::Whole(rows, cols);
  std::vector<uint8_t> blob = Quantize(format, g, w);
  const std::vector<float> f32 = DequantizedF32(blob, format, g);
  const std::vector<uint16_t> bf16 = Dequantized<uint16_t>(blob, format, g, DType::kBF16);
  const std::vector<uint16_t> fp16 = Dequantized<uint16_t>(blob, format, g, DType::kF16);
  int64_t bad_bf16 = 0, bad_fp16 = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    bad_bf16 += bf16[i] != FloatToBf16(f32[i]);
    bad_fp16 += fp16[i] != FloatToHalf(f32[i]);
  }
  EXPECT_EQ(bad_bf16, 0);
  EXPECT_EQ(bad_fp16, 0);
}

TEST_P(QuantFormatTest, TheBitsDoNotDependOnTheThreadCount) {
  const QuantFormat format = GetParam().format;
  const int64_t rows = 512, cols = 512;  // above the parallel grain
  const std::vector<float> w = Normal(rows * cols, 9, 0.02f);
  const QuantGeometry g = QuantGeometry::Whole(rows, cols);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<uint8_t> one = Quantize(format, g, w);
  const std::vector<float> one_values = DequantizedF32(one, format, g);
  omp_set_num_threads(3);
  std::vector<uint8_t> three = Quantize(format, g, w);
  const std::vector<float> three_values = DequantizedF32(three, format, g);
  omp_set_num_threads(saved);
  ASSERT_EQ(one.size(), three.size());
  EXPECT_EQ(FirstDifference(one.data(), three.data(), static_cast<int64_t>(one.size())), -1);
  EXPECT_EQ(FirstDifference(one_values.data(), three_values.data(),
                            static_cast<int64_t>(one_values.size() * 4)),
            -1);
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantFormatTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

float LoadFloat(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// bnb_quant.py's bound on a double-quantized absmax: half the dynamic map's widest gap times
// the block's scale, plus two fp32 roundings (the product and the sum with the offset).
TEST(QuantDoubleQuantTest, AbsmaxStaysWithinItsBound) {
  const std::array<float, 256>& map = DynamicMap();
  double max_gap = 0.0;
  for (size_t i = 1; i < map.size(); ++i) max_gap = std::max(max_gap, double{map[i]} - map[i - 1]);
  // Weights whose blocks have absmax values spread over two orders of magnitude.
  const int64_t rows = 300, cols = 256;
  std::vector<float> w = Normal(rows * cols, 10, 0.02f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) w[r * cols + c] *= 1.0f + static_cast<float>(r % 50);
  }
  const QuantGeometry g = QuantGeometry::Whole(rows, cols);
  const std::vector<uint8_t> plain = Quantize({QuantType::kNf4, false}, g, w);
  const std::vector<uint8_t> dq = Quantize({QuantType::kNf4, true}, g, w);
  const QuantLayout pl = LayoutOf({QuantType::kNf4, false}, g);
  const QuantLayout dl = LayoutOf({QuantType::kNf4, true}, g);
  // The codes do not change: bitsandbytes quantizes with the exact absmax.
  EXPECT_EQ(FirstDifference(plain.data(), dq.data(), pl.codes_bytes), -1);
  const float offset = LoadFloat(dq.data() + dl.scales + dl.scales_bytes - 4);
  double worst = 0.0;
  for (int64_t b = 0; b < g.Blocks(); ++b) {
    const float absmax = LoadFloat(plain.data() + pl.absmax + 4 * b);
    const float scale = LoadFloat(dq.data() + dl.scales + 4 * (b / kDoubleQuantBlock));
    const float product = map[dq[dl.absmax_codes + b]] * scale;
    const float got = product + offset;
    const double bound = max_gap / 2 * scale + std::ldexp(1.0, -22) * (scale + std::fabs(absmax));
    worst = std::max(worst, std::fabs(double{got} - absmax) / bound);
  }
  EXPECT_LE(worst, 1.0) << "the worst block's error as a fraction of its bound";
  EXPECT_GT(worst, 0.05) << "the bound should be reached within a factor of 20, not be vacuous";
  // The blob's values are the codes times these absmax values: a 4-bit blob a quarter of fp32's
  // bytes plus about 1/64 byte per element of statistics.
  EXPECT_LT(dl.total, rows * cols / 2 + rows * cols / 64 + 64);
}

TEST(QuantNibblesTest, TheVectorDecoderEqualsTheScalarOne) {
  std::mt19937 gen(11);
  std::vector<uint8_t> packed(200);
  for (uint8_t& b : packed) b = static_cast<uint8_t>(gen());
  for (QuantType type : {QuantType::kNf4, QuantType::kFp4}) {
    for (int64_t n : {1, 15, 16, 17, 63, 64, 333, 400}) {
      std::vector<float> vec(n), scalar(n);
      cpu::DecodeNibbles(packed.data(), n, Codebook(type).data(), 0.0371f, vec.data());
      cpu::DecodeNibblesScalar(packed.data(), n, Codebook(type).data(), 0.0371f, scalar.data());
      EXPECT_EQ(FirstDifference(vec.data(), scalar.data(), n * 4), -1) << n;
    }
  }
}

TEST(QuantRefusalTest, BadInputIsRefusedByName) {
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const QuantFormat nf4{QuantType::kNf4, false};
  std::vector<float> w = Normal(4 * 128, 12, 1.0f);
  // A 4-bit piece whose columns do not split into whole 64-blocks.
  const QuantGeometry split{4, 96, 4, 128, 4, 4, 0, 32};
  EXPECT_NE(message([&] { LayoutOf(nf4, split); }).find("64"), std::string::npos);
  EXPECT_NE(message([&] { LayoutOf({QuantType::kNone, false}, QuantGeometry::Whole(4, 128)); })
                .find("LayoutOf"),
            std::string::npos);
  EXPECT_NE(message([&] {
              LayoutOf({QuantType::kInt8, true}, QuantGeometry::Whole(4, 128));
            }).find("double"),
            std::string::npos);
  w[77] = std::nanf("");
  std::vector<uint8_t> blob(LayoutOf(nf4, QuantGeometry::Whole(4, 128)).total);
  EXPECT_NE(message([&] { QuantizeInto(nf4, QuantGeometry::Whole(4, 128), w.data(), blob.data()); })
                .find("NaN"),
            std::string::npos);
  w[77] = 1e6f;  // beyond fp16, which int8 quantization goes through
  std::vector<uint8_t> int8_blob(LayoutOf({QuantType::kInt8, false}, QuantGeometry::Whole(4, 128)).total);
  EXPECT_NE(message([&] {
              QuantizeInto({QuantType::kInt8, false}, QuantGeometry::Whole(4, 128), w.data(),
                           int8_blob.data());
            }).find("fp16"),
            std::string::npos);
  // Dequantize checks the blob's size and the output's shape before writing.
  CpuOps ops;
  std::vector<float> out(4 * 128, 7.0f);
  EXPECT_NE(message([&] {
              ops.Dequantize(Tensor(blob.data(), DType::kU8, {static_cast<int64_t>(blob.size()) - 4}),
                             nf4, QuantGeometry::Whole(4, 128),
                             Tensor(out.data(), DType::kF32, {4, 128}));
            }).find("Dequantize"),
            std::string::npos);
  EXPECT_NE(message([&] {
              ops.Dequantize(Tensor(blob.data(), DType::kU8, {static_cast<int64_t>(blob.size())}),
                             nf4, QuantGeometry::Whole(4, 128),
                             Tensor(out.data(), DType::kF32, {8, 64}));
            }).find("Dequantize"),
            std::string::npos);
  for (float v : out) ASSERT_EQ(v, 7.0f);
}

}  // namespace
}  // namespace ztrain::kernels
