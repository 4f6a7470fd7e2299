#include "core/dtype.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace ztrain {
namespace {

// Reference rounding: among all finite values of the 16-bit format (given as a sorted list of
// (value, bits)), the nearest to x; ties go to the even bit pattern; beyond the largest
// finite value by at least half an ulp, infinity.
struct Table {
  std::vector<std::pair<double, uint16_t>> finite;  // non-negative finite values, sorted
  double max_finite = 0, half_ulp_at_max = 0;
  uint16_t inf_bits = 0;
};

Table MakeTable(float (*to_float)(uint16_t), uint16_t inf_bits) {
  Table t;
  for (uint32_t b = 0; b < 0x8000; ++b) {
    const float f = to_float(static_cast<uint16_t>(b));
    if (std::isfinite(f)) t.finite.push_back({f, static_cast<uint16_t>(b)});
  }
  std::sort(t.finite.begin(), t.finite.end());
  const auto n = t.finite.size();
  t.max_finite = t.finite[n - 1].first;
  t.half_ulp_at_max = (t.finite[n - 1].first - t.finite[n - 2].first) / 2;
  t.inf_bits = inf_bits;
  return t;
}

uint16_t ReferenceRound(const Table& t, float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= t.max_finite + t.half_ulp_at_max) return sign | t.inf_bits;
  auto hi = std::lower_bound(t.finite.begin(), t.finite.end(), std::make_pair(a, uint16_t{0}));
  if (hi == t.finite.end()) return sign | t.finite.back().second;
  if (hi->first == a || hi == t.finite.begin()) return sign | hi->second;
  auto lo = hi - 1;
  const double dl = a - lo->first, dh = hi->first - a;
  if (dl < dh) return sign | lo->second;
  if (dh < dl) return sign | hi->second;
  return sign | ((lo->second & 1) == 0 ? lo->second : hi->second);
}

std::vector<float> InterestingFloats() {
  std::mt19937 rng(7);
  std::vector<float> xs;
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float f = BitsToFloat(bits(rng));
    if (std::isfinite(f)) xs.push_back(f);
  }
  std::uniform_real_distribution<float> small(-70000.f, 70000.f);
  for (int i = 0; i < 100000; ++i) xs.push_back(small(rng));
  std::uniform_real_distribution<float> tiny(-1e-4f, 1e-4f);
  for (int i = 0; i < 100000; ++i) xs.push_back(tiny(rng));
  // Exact halfway points between neighbouring 16-bit values exercise ties-to-even.
  for (uint32_t b = 0; b < 0x7c00; b += 7) {
    xs.push_back(static_cast<float>((double(HalfToFloat(b)) + double(HalfToFloat(b + 1))) / 2));
  }
  for (uint32_t b = 0; b < 0x7f80; b += 5) {
    xs.push_back(BitsToFloat((b << 16) | 0x8000u));
  }
  xs.insert(xs.end(), {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, 5.9604645e-8f,
                       2.9802322e-8f, 2.9802326e-8f, std::numeric_limits<float>::max()});
  return xs;
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  const Table t = MakeTable(Bf16ToFloat, 0x7f80);
  for (float x : InterestingFloats()) {
    ASSERT_EQ(FloatToBf16(x), ReferenceRound(t, x)) << "x = " << x;
  }
}

TEST(DTypeTest, HalfRoundsToNearestEvenWithSubnormalsAndOverflow) {
  const Table t = MakeTable(HalfToFloat, 0x7c00);
  for (float x : InterestingFloats()) {
    ASSERT_EQ(FloatToHalf(x), ReferenceRound(t, x)) << "x = " << x;
  }
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // halfway to 65536 rounds to even: infinity
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(5.9604645e-8f), 0x0001);  // smallest subnormal
}

TEST(DTypeTest, EverySixteenBitValueRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = static_cast<uint16_t>(b);
    const float fh = HalfToFloat(h), fb = Bf16ToFloat(h);
    if (std::isnan(fh)) {
      ASSERT_TRUE(std::isnan(HalfToFloat(FloatToHalf(fh))));
    } else {
      ASSERT_EQ(FloatToHalf(fh), h) << b;
    }
    if (std::isnan(fb)) {
      ASSERT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(fb))));
    } else {
      ASSERT_EQ(FloatToBf16(fb), h) << b;
    }
  }
}

TEST(DTypeTest, BulkConversionMatchesScalar) {
  std::vector<float> src(100003);
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.f, 100.f);
  for (float& x : src) x = d(rng);
  for (DType t : {DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> out(src.size());
    std::vector<float> back(src.size());
    ConvertFromFloat(src.data(), out.data(), t, src.size());
    ConvertToFloat(out.data(), t, back.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      const uint16_t want = t == DType::kBF16 ? FloatToBf16(src[i]) : FloatToHalf(src[i]);
      ASSERT_EQ(out[i], want);
      ASSERT_EQ(back[i], t == DType::kBF16 ? Bf16ToFloat(want) : HalfToFloat(want));
    }
  }
}

TEST(DTypeTest, NamesAndSizes) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(ParseDType("bfloat16"), DType::kBF16);
  EXPECT_THROW(ParseDType("fp8"), Error);
}

}  // namespace
}  // namespace ztrain
