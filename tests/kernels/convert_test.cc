// The bulk dtype conversions (kernels/cpu/convert.h) against core/dtype.h's scalar ones, bit
// for bit, and Copy between float dtypes.
#include "kernels/cpu/convert.h"

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "half_test_util.h"

namespace ztrain::kernels {
namespace {

using testing::ExpectErrorMentions;

// fp32 bit patterns where rounding is easy to get wrong: ties both ways, the largest values
// below and at each overflow, subnormals of both formats, zeros, infinities, NaNs.
std::vector<uint32_t> EdgeFloats() {
  std::vector<uint32_t> v = {0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007fffff, 0x807fffff,
                             0x00800000, 0x00400000, 0x3f808000, 0x3f818000, 0x3f808001, 0x3f80ffff,
                             0x3f7fffff, 0x7f7fffff, 0xff7fffff, 0x7f7f8000, 0x7f7f7fff, 0x7f800000,
                             0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0x7fbfffff,
                             0x477fe000, 0x477ff000, 0x477fefff, 0x47800000, 0x38800000, 0x387fc000,
                             0x387fe000, 0x33800000, 0x33000000, 0x33000001, 0xb3000001, 0x3f801000,
                             0x3f803000, 0x3f800fff, 0x3f802000, 0x3c000000, 0x40490fdb};
  std::mt19937 gen(7);
  for (int i = 0; i < 1000003 - static_cast<int>(v.size()); ++i) v.push_back(gen());
  return v;
}

std::vector<float> AsFloats(const std::vector<uint32_t>& bits) {
  std::vector<float> f(bits.size());
  std::memcpy(f.data(), bits.data(), bits.size() * 4);
  return f;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(ConvertTest, NarrowIsBitwiseTheScalarRoundingForEveryEdgeAndLength) {
  const std::vector<float> src = AsFloats(EdgeFloats());  // odd length: a vector tail
  for (DType t : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(t));
    for (size_t n : {size_t{1}, size_t{15}, size_t{17}, size_t{41}, src.size()}) {
      std::vector<uint16_t> got(n, 0xdead);
      cpu::Narrow(src.data(), got.data(), t, static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i) {
        const uint16_t want = t == DType::kBF16 ? FloatToBf16(src[i]) : FloatToHalf(src[i]);
        ASSERT_EQ(got[i], want) << "n=" << n << " element " << i << " fp32 bits " << std::hex
                                << Bits(src[i]);
      }
    }
  }
}

TEST(ConvertTest, SubnormalsInAVectorAreNotFlushed) {
  // 16 lanes, one an fp32 subnormal: the AVX512-BF16 instruction alone would give +0.
  std::vector<float> src(32, 1.5f);
  const std::vector<float> sub = AsFloats({0x00412345u, 0x80400000u});
  src[5] = sub[0];
  src[20] = sub[1];  // -2^-127
  std::vector<uint16_t> got(32);
  cpu::Narrow(src.data(), got.data(), DType::kBF16, 32);
  EXPECT_EQ(got[5], 0x0041u);  // bf16 subnormals, as FloatToBf16 gives
  EXPECT_EQ(got[20], 0x8040u);
  EXPECT_EQ(got[0], 0x3fc0u);
}

TEST(ConvertTest, WidenIsExactForEveryBitPattern) {
  std::vector<uint16_t> all(65536 + 7);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (DType t : {DType::kBF16, DType::kF16}) {
    std::vector<float> got(all.size());
    cpu::Widen(all.data(), t, got.data(), static_cast<int64_t>(all.size()));
    for (size_t i = 0; i < all.size(); ++i) {
      const float want = t == DType::kBF16 ? Bf16ToFloat(all[i]) : HalfToFloat(all[i]);
      ASSERT_EQ(Bits(got[i]), Bits(want)) << DTypeName(t) << " pattern " << std::hex << all[i];
    }
  }
}

TEST(ConvertTest, Bf16AndFp16ConvertThroughFp32WithOneRounding) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<uint16_t> to_half(all.size()), to_bf16(all.size());
  cpu::ConvertFloat(all.data(), DType::kBF16, to_half.data(), DType::kF16, 65536);
  cpu::ConvertFloat(all.data(), DType::kF16, to_bf16.data(), DType::kBF16, 65536);
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(to_half[i], FloatToHalf(Bf16ToFloat(all[i]))) << i;
    ASSERT_EQ(to_bf16[i], FloatToBf16(HalfToFloat(all[i]))) << i;
  }
}

TEST(ConvertTest, CopyConvertsBetweenFloatDtypesAndMovesBytesOtherwise) {
  auto ops = MakeCpuOps();
  const int64_t n = 100003;  // several parallel chunks and a tail
  const std::vector<float> src = testing::Random(n, 3, -70000.0f, 70000.0f);  // fp16 overflows
  const DType types[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (DType from : types) {
    const testing::HostTensor a = testing::HostTensor::From(from, {n}, src);
    for (DType to : types) {
      SCOPED_TRACE(std::string(DTypeName(from)) + " -> " + std::string(DTypeName(to)));
      testing::HostTensor b(to, {n});
      ops->Copy(a.tensor(), b.tensor());
      const testing::HostTensor want = testing::HostTensor::From(to, {n}, a.Values());
      ASSERT_TRUE(b.SameBytes(want));
    }
  }
  std::vector<float> f(4);
  std::vector<int32_t> i(4);
  ExpectErrorMentions(
      [&] { ops->Copy(Tensor(i.data(), DType::kI32, {4}), Tensor(f.data(), DType::kF32, {4})); },
      {"Copy", "dst", "fp32", "int32"});
  ExpectErrorMentions(
      [&] {
        ops->Copy(Tensor(f.data(), DType::kF32, {4}), Tensor(i.data(), DType::kBF16, {2, 2}));
      },
      {"Copy", "dst", "shape"});
}

}  // namespace
}  // namespace ztrain::kernels
