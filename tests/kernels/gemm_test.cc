// Gemm and the linear layer against double references and finite differences.
#include <cstdlib>
#include <string>
#include <vector>

#include "frozen_test_util.h"
#include "kernel_test_util.h"
#include "kernels/cpu/onednn_matmul.h"
#include "tests/scoped_env.h"

namespace ztrain::kernels {
namespace {

using testing::ExpectClose;
using testing::ExpectErrorMentions;
using testing::Random;
using testing::View;

// c = alpha * op(a) op(b) + beta * c in double, row-major.
std::vector<double> RefGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                            const std::vector<float>& a, const std::vector<float>& b,
                            double beta, const std::vector<float>& c) {
  std::vector<double> out(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        s += double{a[ta ? p * m + i : i * k + p]} * b[tb ? j * k + p : p * n + j];
      }
      out[i * n + j] = alpha * s + beta * c[i * n + j];
    }
  }
  return out;
}

// y = x W^T + b in double; x [rows, ch], W [oc, ch].
std::vector<double> RefLinear(const std::vector<double>& x, const std::vector<double>& w,
                              const std::vector<double>* b, int64_t rows, int64_t ch,
                              int64_t oc) {
  std::vector<double> y(rows * oc);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < oc; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (int64_t c = 0; c < ch; ++c) s += x[r * ch + c] * w[o * ch + c];
      y[r * oc + o] = s;
    }
  }
  return y;
}

void ExpectGemmsMatchTheReference(const std::string& backend) {
  auto ops = MakeCpuOps();
  const int64_t m = 13, n = 17, k = 35;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (float beta : {0.0f, 1.0f, -0.5f}) {
        auto a = Random(m * k, 1), b = Random(k * n, 2), c = Random(m * n, 3);
        const auto want = RefGemm(ta, tb, m, n, k, 0.75, a, b, beta, c);
        ops->Gemm(ta, tb, 0.75f, View(a, ta ? Shape{k, m} : Shape{m, k}),
                  View(b, tb ? Shape{n, k} : Shape{k, n}), beta, View(c, {m, n}));
        ExpectClose(c, want, 1e-5,
                    backend + " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
      }
    }
  }
}

TEST(GemmTest, MatchesDoubleReferenceForEveryTransposeAndBeta) {
  ExpectGemmsMatchTheReference("OpenBLAS");
}

// Note [fp32 GEMMs on oneDNN]: the same products through oneDNN's fp32 matmul
// (ZTRAIN_FP32_GEMM=onednn), and a value it does not know refused by name.
TEST(GemmTest, OneDnnFp32GemmsMatchTheReferenceWhenChosen) {
  if (!cpu::OneDnnBuiltIn()) GTEST_SKIP() << "this build has no oneDNN";
  ztrain::testing::ScopedEnv env("ZTRAIN_FP32_GEMM", "onednn");
  ExpectGemmsMatchTheReference("oneDNN");
  auto ops = MakeCpuOps();
  const int64_t rows = 9, ch = 21, oc = 11;
  auto x = Random(rows * ch, 4), w = Random(oc * ch, 5), bias = Random(oc, 6);
  std::vector<float> y(rows * oc);
  ops->LinearForward(View(x, {rows, ch}), View(w, {oc, ch}), View(bias, {oc}), View(y, {rows, oc}));
  const std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()),
      bd(bias.begin(), bias.end());
  ExpectClose(y, RefLinear(xd, wd, &bd, rows, ch, oc), 1e-5, "oneDNN linear");
  env.Set("mkl");
  ExpectErrorMentions(
      [&] {
        ops->LinearForward(View(x, {rows, ch}), View(w, {oc, ch}), View(bias, {oc}),
                           View(y, {rows, oc}));
      },
      {"ZTRAIN_FP32_GEMM is 'mkl'", "give auto (the default", "openblas or onednn"});
}

// Note [GEMMs chosen by measurement]: a plan that names a shape oneDNN sends that shape's
// products to oneDNN (the same bits as ZTRAIN_FP32_GEMM=onednn gives, which differ from
// OpenBLAS's here) and leaves every other shape on OpenBLAS.
TEST(GemmTest, APlanSendsTheShapesItNamesToOneDnn) {
  if (!cpu::OneDnnBuiltIn()) GTEST_SKIP() << "this build has no oneDNN";
  ztrain::testing::ScopedEnv env("ZTRAIN_FP32_GEMM", nullptr);
  const int64_t rows = 48, ch = 512, oc = 40;
  auto x = Random(rows * ch, 7), w = Random(oc * ch, 8);
  const auto linear = [&](const GemmPlan& plan, const char* choice) {
    env.Set(choice);
    auto ops = MakeCpuOps();
    ops->UseGemmPlan(plan);
    std::vector<float> y(rows * oc);
    ops->LinearForward(View(x, {rows, ch}), View(w, {oc, ch}), Tensor(), View(y, {rows, oc}));
    return y;
  };
  const auto openblas = linear(GemmPlan(), "openblas"), onednn = linear(GemmPlan(), "onednn");
  ASSERT_NE(openblas, onednn) << "the two backends agree bit for bit on this shape: the test "
                                 "cannot tell them apart";
  GemmPlan plan;
  plan.Choose({false, true, rows, oc, ch}, GemmBackend::kOneDnn);
  EXPECT_EQ(linear(plan, "auto"), onednn);
  EXPECT_EQ(linear(GemmPlan(), "auto"), openblas);
  GemmPlan other;  // another shape named: this one stays on OpenBLAS
  other.Choose({false, true, rows + 1, oc, ch}, GemmBackend::kOneDnn);
  EXPECT_EQ(linear(other, "auto"), openblas);
  EXPECT_EQ(linear(plan, "openblas"), openblas);  // the environment overrides the plan
}

TEST(GemmTest, EmptyInnerDimensionScalesC) {
  auto ops = MakeCpuOps();
  std::vector<float> a, b, c = {1, 2, 3, 4};
  ops->Gemm(false, false, 1.0f, View(a, {2, 0}), View(b, {0, 2}), 0.5f, View(c, {2, 2}));
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2}));
}

TEST(GemmTest, RejectsMismatchedShapesAndDtypes) {
  auto ops = MakeCpuOps();
  std::vector<float> a(6), b(6), c(4);
  ExpectErrorMentions([&] { ops->Gemm(false, false, 1, View(a, {2, 3}), View(b, {2, 3}), 0,
                                      View(c, {2, 2})); },
                      {"Gemm", "b"});
  ExpectErrorMentions([&] { ops->Gemm(false, true, 1, View(a, {2, 3}), View(b, {2, 3}), 0,
                                      View(c, {4})); },
                      {"Gemm", "2-D"});
  Tensor ints(a.data(), DType::kI32, {2, 3});  // bf16 and fp16 are valid (half_ops_test.cc)
  ExpectErrorMentions([&] { ops->Gemm(false, true, 1, ints, View(b, {2, 3}), 0,
                                      View(c, {2, 2})); },
                      {"Gemm", "a", "int32", "fp32, bf16 or fp16"});
}

TEST(LinearTest, ForwardMatchesReferenceWithAndWithoutBias) {
  auto ops = MakeCpuOps();
  const int64_t batch = 2, seq = 5, ch = 24, oc = 40;
  auto x = Random(batch * seq * ch, 4), w = Random(oc * ch, 5), b = Random(oc, 6);
  std::vector<float> y(batch * seq * oc);
  const auto xd = testing::ToDouble(x), wd = testing::ToDouble(w), bd = testing::ToDouble(b);
  ops->LinearForward(View(x, {batch, seq, ch}), View(w, {oc, ch}), View(b, {oc}),
                     View(y, {batch, seq, oc}));
  ExpectClose(y, RefLinear(xd, wd, &bd, batch * seq, ch, oc), 1e-5, "with bias");
  ops->LinearForward(View(x, {batch * seq, ch}), View(w, {oc, ch}), Tensor(),
                     View(y, {batch * seq, oc}));
  ExpectClose(y, RefLinear(xd, wd, nullptr, batch * seq, ch, oc), 1e-5, "without bias");
}

TEST(LinearTest, BackwardMatchesFiniteDifferences) {
  auto ops = MakeCpuOps();
  const int64_t rows = 7, ch = 19, oc = 33;
  auto x = Random(rows * ch, 7), w = Random(oc * ch, 8), b = Random(oc, 9);
  auto dy = Random(rows * oc, 10);  // objective L = sum(y * dy)
  std::vector<float> dx(rows * ch, 99.0f), dw(oc * ch, 0.0f), db(oc, 0.0f);
  ops->LinearBackward(View(dy, {rows, oc}), View(x, {rows, ch}), View(w, {oc, ch}),
                      View(dx, {rows, ch}), View(dw, {oc, ch}), View(db, {oc}));
  const auto xd = testing::ToDouble(x), wd = testing::ToDouble(w), bd = testing::ToDouble(b);
  auto loss_x = [&](const std::vector<double>& v) {
    return testing::Dot(RefLinear(v, wd, &bd, rows, ch, oc), dy);
  };
  auto loss_w = [&](const std::vector<double>& v) {
    return testing::Dot(RefLinear(xd, v, &bd, rows, ch, oc), dy);
  };
  auto loss_b = [&](const std::vector<double>& v) {
    return testing::Dot(RefLinear(xd, wd, &v, rows, ch, oc), dy);
  };
  testing::ExpectGradMatchesFiniteDiff(dx, loss_x, x, 1000, 1e-4, "dx");
  testing::ExpectGradMatchesFiniteDiff(dw, loss_w, w, 1000, 1e-4, "dweight");
  testing::ExpectGradMatchesFiniteDiff(db, loss_b, b, 1000, 1e-4, "dbias");
}

TEST(LinearTest, BackwardAccumulatesParameterGradsAndCanSkipDx) {
  auto ops = MakeCpuOps();
  const int64_t rows = 70, ch = 9, oc = 130;  // oc spans several column blocks
  auto x = Random(rows * ch, 11), w = Random(oc * ch, 12), dy = Random(rows * oc, 13);
  std::vector<float> dw1(oc * ch, 0.0f), db1(oc, 0.0f), dx(rows * ch);
  ops->LinearBackward(View(dy, {rows, oc}), View(x, {rows, ch}), View(w, {oc, ch}),
                      View(dx, {rows, ch}), View(dw1, {oc, ch}), View(db1, {oc}));
  std::vector<float> dw2(oc * ch, 0.0f), db2(oc, 0.0f);
  for (int rep = 0; rep < 2; ++rep) {
    ops->LinearBackward(View(dy, {rows, oc}), View(x, {rows, ch}), View(w, {oc, ch}), Tensor(),
                        View(dw2, {oc, ch}), View(db2, {oc}));
  }
  std::vector<double> twice_w(dw1.size()), twice_b(db1.size());
  for (size_t i = 0; i < dw1.size(); ++i) twice_w[i] = 2.0 * dw1[i];
  for (size_t i = 0; i < db1.size(); ++i) twice_b[i] = 2.0 * db1[i];
  ExpectClose(dw2, twice_w, 1e-6, "dweight after two calls");
  ExpectClose(db2, twice_b, 1e-6, "dbias after two calls");
}

// Note [Frozen parameters]: an undefined dweight and/or dbias is skipped; dx and the other
// gradient come out bit for bit, on the fp32 path and the 16-bit ones (gemm_mixed.cc).
TEST(LinearTest, BackwardSkipsFrozenParameterGrads) {
  using testing::ArgSpec;
  using testing::Role;
  auto ops = MakeCpuOps();
  const int64_t rows = 21, ch = 24, oc = 130;  // oc spans several column blocks
  std::vector<ArgSpec> specs = {{"dy", Role::kAct, {rows, oc}},     {"x", Role::kAct, {rows, ch}},
                                {"weight", Role::kParam, {oc, ch}}, {"dx", Role::kOut, {rows, ch}},
                                {"dweight", Role::kGrad, {oc, ch}}, {"dbias", Role::kGrad, {oc}}};
  testing::ExpectFrozenGradsSkippedEverywhere(
      *ops, specs, {{"dweight"}, {"dbias"}, {"dweight", "dbias"}},
      [](Ops& o, const auto& v) { o.LinearBackward(v[0], v[1], v[2], v[3], v[4], v[5]); });
  specs.erase(specs.begin() + 3);  // without dx, as the providers' extra linears run
  testing::ExpectFrozenGradsSkippedEverywhere(
      *ops, specs, {{"dweight"}, {"dweight", "dbias"}},
      [](Ops& o, const auto& v) { o.LinearBackward(v[0], v[1], v[2], Tensor(), v[3], v[4]); });
}

TEST(LinearTest, RejectsWrongShapes) {
  auto ops = MakeCpuOps();
  std::vector<float> x(12), w(12), b(3), y(12), y9(9), dw(12);
  ExpectErrorMentions([&] { ops->LinearForward(View(x, {3, 4}), View(w, {3, 4}), View(b, {3}),
                                               View(y, {4, 3})); },
                      {"LinearForward", "y", "[3, 3]"});
  ExpectErrorMentions([&] { ops->LinearForward(View(x, {4, 3}), View(w, {3, 4}), View(b, {3}),
                                               View(y, {4, 3})); },
                      {"LinearForward", "x"});
  ExpectErrorMentions([&] { ops->LinearForward(View(x, {3, 4}), View(w, {3, 4}),
                                               View(y, {12}), View(y9, {3, 3})); },
                      {"LinearForward", "bias"});
  ExpectErrorMentions([&] { ops->LinearBackward(View(y, {4, 3}), View(x, {3, 4}),
                                                View(w, {3, 4}), Tensor(), View(dw, {3, 4}),
                                                Tensor()); },
                      {"LinearBackward", "dy"});
}

}  // namespace
}  // namespace ztrain::kernels
