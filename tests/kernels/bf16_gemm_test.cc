// GEMMs on bf16 operands through oneDNN (Note [bf16 GEMMs] in kernels/cpu/gemm_mixed.cc):
// against the fp32 op on the same rounded inputs, against the SGEMM fallback for every
// transpose and odd shapes, and the one log line that says which path runs and why. Without
// oneDNN (the build, the CPU, or ZTRAIN_ONEDNN=0, which CTest also runs) the oneDNN-only
// tests skip and the others check the fallback.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "half_test_util.h"
#include "kernels/cpu/bf16_speed.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/onednn_matmul.h"
#include "tests/scoped_env.h"

namespace ztrain::kernels {
namespace {

using testing::ArgSpec;
using testing::HostTensor;
using testing::Role;

bool OneDnnOffByEnvironment() {
  const char* env = std::getenv("ZTRAIN_ONEDNN");
  return env != nullptr && std::string(env) == "0";
}

TEST(Bf16GemmTest, OneDnnIsChosenWhereTheBuildAndTheCpuHaveIt) {
  const cpu::OneDnnSupport& support = cpu::OneDnnBf16Support();
  CpuOps ops;
  EXPECT_EQ(ops.Bf16GemmsOnOneDnn(), support.available) << support.detail;
  if (!cpu::OneDnnBuiltIn()) {
    EXPECT_NE(support.detail.find("no oneDNN"), std::string::npos) << support.detail;
  } else if (OneDnnOffByEnvironment()) {
    EXPECT_FALSE(support.available);
    EXPECT_NE(support.detail.find("ZTRAIN_ONEDNN=0"), std::string::npos) << support.detail;
  } else {
    // AMX-BF16 CPUs have AVX512-BF16 too.
    EXPECT_EQ(support.available, __builtin_cpu_supports("avx512bf16") != 0) << support.detail;
  }
  CpuOps forced(Bf16GemmPath::kSgemm);
  EXPECT_FALSE(forced.Bf16GemmsOnOneDnn());
}

TEST(Bf16GemmTest, GemmAndLinearMatchTheFp32OpOnRoundedInputs) {
  CpuOps ops;  // oneDNN wherever the operands are both bf16 and it is available
  const int64_t m = 37, n = 45, k = 70, rows = 33, ch = 48, oc = 80;
  uint32_t seed = 1;
  for (const testing::DtypeMix& mix : testing::EngineMixes()) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      SCOPED_TRACE("ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
      const Shape a_shape = ta ? Shape{k, m} : Shape{m, k},
                  b_shape = tb ? Shape{n, k} : Shape{k, n};
      testing::ExpectMatchesFp32OnRoundedInputs(
          ops,
          {{"a", Role::kAct, a_shape}, {"b", Role::kParam, b_shape}, {"c", Role::kOut, {m, n}}},
          mix, [&](Ops& o, const auto& v) { o.Gemm(ta, tb, 1.5f, v[0], v[1], 0.0f, v[2]); }, ++seed,
          true);
      testing::ExpectMatchesFp32OnRoundedInputs(
          ops, {{"a", Role::kAct, a_shape}, {"b", Role::kAct, b_shape}, {"c", Role::kGrad, {m, n}}},
          mix, [&](Ops& o, const auto& v) { o.Gemm(ta, tb, -0.5f, v[0], v[1], 0.75f, v[2]); },
          ++seed, true);
    }
    testing::ExpectMatchesFp32OnRoundedInputs(
        ops,
        {{"x", Role::kAct, {3, 11, ch}},
         {"weight", Role::kParam, {oc, ch}},
         {"bias", Role::kParam, {oc}},
         {"y", Role::kOut, {3, 11, oc}}},
        mix, [](Ops& o, const auto& v) { o.LinearForward(v[0], v[1], v[2], v[3]); }, ++seed, true);
    testing::ExpectMatchesFp32OnRoundedInputs(
        ops,
        {{"dy", Role::kAct, {rows, oc}},
         {"x", Role::kAct, {rows, ch}},
         {"weight", Role::kParam, {oc, ch}},
         {"dx", Role::kOut, {rows, ch}},
         {"dweight", Role::kGrad, {oc, ch}},
         {"dbias", Role::kGrad, {oc}}},
        mix, [](Ops& o, const auto& v) { o.LinearBackward(v[0], v[1], v[2], v[3], v[4], v[5]); },
        ++seed, true);
  }
}

struct GemmShape {
  int64_t m, n, k;
};

// c = alpha op(a) op(b) + beta c with bf16 a and b and c of c_type, on `ops`.
HostTensor RunGemm(CpuOps& ops, bool ta, bool tb, const GemmShape& s, DType c_type, float alpha,
                   float beta, uint32_t seed) {
  const HostTensor a = HostTensor::From(DType::kBF16, ta ? Shape{s.k, s.m} : Shape{s.m, s.k},
                                        testing::Random(s.m * s.k, seed));
  const HostTensor b = HostTensor::From(DType::kBF16, tb ? Shape{s.n, s.k} : Shape{s.k, s.n},
                                        testing::Random(s.k * s.n, seed + 1));
  HostTensor c = HostTensor::From(c_type, {s.m, s.n}, testing::Random(s.m * s.n, seed + 2));
  ops.Gemm(ta, tb, alpha, a.tensor(), b.tensor(), beta, c.tensor());
  return c;
}

TEST(Bf16GemmTest, OneDnnMatchesTheSgemmPathForEveryTransposeAndOddShapes) {
  CpuOps onednn, sgemm(Bf16GemmPath::kSgemm);
  if (!onednn.Bf16GemmsOnOneDnn()) GTEST_SKIP() << cpu::OneDnnBf16Support().detail;
  const GemmShape shapes[] = {{1, 1, 1},      {1, 1024, 17},   {17, 1, 255},
                              {255, 17, 1},   {1024, 255, 17}, {17, 1024, 255},
                              {255, 1, 1024}, {1024, 1024, 1}, {255, 1024, 1024}};
  uint32_t seed = 50;
  for (const GemmShape& s : shapes) {
    for (int t = 0; t < 4; ++t) {
      for (DType c_type : {DType::kF32, DType::kBF16}) {
        for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, -1.0f}}) {
          const bool ta = t & 1, tb = t & 2;
          SCOPED_TRACE(detail::StrCat("m=", s.m, " n=", s.n, " k=", s.k, " ta=", ta, " tb=", tb,
                                      " c ", DTypeName(c_type), " alpha=", alpha, " beta=", beta));
          seed += 3;
          const HostTensor got = RunGemm(onednn, ta, tb, s, c_type, alpha, beta, seed);
          const HostTensor want = RunGemm(sgemm, ta, tb, s, c_type, alpha, beta, seed);
          const std::vector<float> w = want.Values();
          testing::ExpectClose(got.Values(), std::vector<double>(w.begin(), w.end()),
                               testing::GemmTolerance(c_type), "c");
        }
      }
    }
  }
}

TEST(Bf16GemmTest, TheForcedFallbackSaysSoOnceAndIsExact) {
  testing::LogCapture log;
  CpuOps ops(Bf16GemmPath::kSgemm);
  const GemmShape s{40, 50, 60};
  const HostTensor first = RunGemm(ops, false, true, s, DType::kBF16, 1.0f, 0.0f, 7);
  RunGemm(ops, true, false, s, DType::kF32, 1.0f, 1.0f, 8);
  EXPECT_EQ(log.Count("bf16 GEMMs run as OpenBLAS SGEMM"), 1) << log.text();
  EXPECT_EQ(log.Count("Bf16GemmPath::kSgemm"), 1) << log.text();
  // The fallback is SGEMM on the widened operands, rounded once.
  const HostTensor a = HostTensor::From(DType::kBF16, {s.m, s.k}, testing::Random(s.m * s.k, 7));
  const HostTensor b = HostTensor::From(DType::kBF16, {s.n, s.k}, testing::Random(s.k * s.n, 8));
  std::vector<float> a32 = a.Values(), b32 = b.Values(), c32(s.m * s.n);
  ops.Gemm(false, true, 1.0f, testing::View(a32, {s.m, s.k}), testing::View(b32, {s.n, s.k}), 0.0f,
           testing::View(c32, {s.m, s.n}));
  EXPECT_TRUE(first.SameBytes(HostTensor::From(DType::kBF16, {s.m, s.n}, c32)));
}

TEST(Bf16GemmTest, TheAutomaticPathSaysWhichOnceAndFp32GemmsSayNothing) {
  testing::LogCapture log;
  CpuOps ops;
  std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64);
  ops.Gemm(false, false, 1.0f, testing::View(a, {8, 8}), testing::View(b, {8, 8}), 0.0f,
           testing::View(c, {8, 8}));
  EXPECT_EQ(log.Count("bf16 GEMMs"), 0) << log.text();
  const GemmShape s{8, 8, 8};
  for (uint32_t seed : {1u, 2u, 3u}) RunGemm(ops, false, false, s, DType::kBF16, 1, 0, seed);
  const cpu::OneDnnSupport& support = cpu::OneDnnBf16Support();
  EXPECT_EQ(log.Count("bf16 GEMMs"), 1) << log.text();
  EXPECT_EQ(log.Count(support.detail), 1) << log.text();  // the reason, or oneDNN's version
  EXPECT_EQ(log.Count(support.available ? "bf16 GEMMs run on oneDNN"
                                        : "bf16 GEMMs run as OpenBLAS SGEMM"),
            1)
      << log.text();
}

TEST(Bf16GemmTest, Fp16OperandsAndMixedOperandsUseSgemmExactly) {
  // Only bf16 x bf16 goes to oneDNN: an fp16 operand, or a bf16 weight with an fp32 x, is
  // widened and multiplied in fp32, so the result is the fp32 op's, rounded once.
  CpuOps ops;
  const int64_t rows = 9, ch = 24, oc = 31;
  const DType f32 = DType::kF32, bf16 = DType::kBF16, f16 = DType::kF16;
  for (const testing::DtypeMix& mix :
       {testing::DtypeMix{"fp32 x, bf16 weight", f32, bf16, bf16, f32},
        testing::DtypeMix{"fp16 x, bf16 weight", f16, bf16, f32, bf16},
        testing::DtypeMix{"all fp16", f16, f16, f16, f16}}) {
    testing::ExpectMatchesFp32OnRoundedInputs(
        ops,
        {{"x", Role::kAct, {rows, ch}},
         {"weight", Role::kParam, {oc, ch}},
         {"bias", Role::kParam, {oc}},
         {"y", Role::kOut, {rows, oc}}},
        mix, [](Ops& o, const auto& v) { o.LinearForward(v[0], v[1], v[2], v[3]); }, 5);
  }
}

}  // namespace
}  // namespace ztrain::kernels

namespace ztrain::kernels {
namespace {

// oneDNN's fp32 matmul (MatmulArgs::ab_type fp32, what `ztrain tune --gemm` times against
// SGEMM) computes the product: against a double-precision reference, with transposes and
// leading dimensions wider than the rows, within fp32 rounding of a k-term sum.
// Note [bf16 where it pays]: bf16 is held against the fp32 backend an fp32 run would use for
// the shape, as ZTRAIN_FP32_GEMM names it here (unset, the faster by the margin: the rule of
// GemmChoiceTest.OneDnnMustWinByTheMargin).
TEST(Bf16SpeedTest, Fp32IsTimedOnTheBackendAnFp32RunWouldUse) {
  if (!cpu::OneDnnBf16Support().available) GTEST_SKIP() << cpu::OneDnnBf16Support().detail;
  ztrain::testing::ScopedEnv env("ZTRAIN_FP32_GEMM", "openblas");
  EXPECT_STREQ(MeasureBf16Speed(512, 512).fp32_backend, "OpenBLAS");
  env.Set("onednn");
  const Bf16Speed onednn = MeasureBf16Speed(512, 512);
  EXPECT_STREQ(onednn.fp32_backend, "oneDNN");
  EXPECT_GT(onednn.fp32_gflops, 0.0);
}

TEST(OneDnnFp32MatmulTest, MatchesADoubleReference) {
  if (!cpu::OneDnnBuiltIn()) GTEST_SKIP() << "this build has no oneDNN";
  const int64_t m = 37, n = 53, k = 71, lda = m + 3, ldb = k + 5, ldc = n + 2;
  std::vector<float> a(static_cast<size_t>(k * lda)), b(static_cast<size_t>(n * ldb));
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * static_cast<float>(i));
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11f * static_cast<float>(i));
  std::vector<float> c(static_cast<size_t>(m * ldc), -1.0f);
  cpu::MatmulArgs args;
  args.trans_a = true, args.trans_b = true;  // a stored [k, m], b stored [n, k]
  args.m = m, args.n = n, args.k = k;
  args.ab_type = DType::kF32;
  args.a = a.data(), args.lda = lda, args.b = b.data(), args.ldb = ldb;
  args.c = c.data(), args.ldc = ldc;
  cpu::OneDnnMatmul matmul;
  ASSERT_TRUE(matmul.Run(args));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0.0, magnitude = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double term = double{a[static_cast<size_t>(p * lda + i)]} *
                            double{b[static_cast<size_t>(j * ldb + p)]};
        want += term;
        magnitude += std::abs(term);
      }
      EXPECT_NEAR(c[static_cast<size_t>(i * ldc + j)], want, 2.0 * k * 6e-8 * magnitude)
          << i << ", " << j;
    }
  }
}

}  // namespace
}  // namespace ztrain::kernels
