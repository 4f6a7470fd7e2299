// Add, AddInPlace, Zero, Copy, Scale and SumSquares, including aliasing and sizes above the
// parallel threshold.
#include <cstdint>
#include <vector>

#include "kernel_test_util.h"

namespace ztrain::kernels {
namespace {

using testing::ExpectErrorMentions;
using testing::Random;
using testing::View;

constexpr int64_t kBig = 100001;  // above the parallel threshold, odd

TEST(ElementwiseTest, AddAndAddInPlaceAreExactSums) {
  auto ops = MakeCpuOps();
  auto a = Random(kBig, 1), b = Random(kBig, 2);
  std::vector<float> y(kBig);
  ops->Add(View(a, {kBig}), View(b, {kBig}), View(y, {kBig}));
  for (int64_t i = 0; i < kBig; ++i) ASSERT_EQ(y[i], a[i] + b[i]) << i;
  ops->AddInPlace(View(y, {kBig}), View(a, {kBig}));
  for (int64_t i = 0; i < kBig; ++i) ASSERT_EQ(y[i], (a[i] + b[i]) + a[i]) << i;
}

TEST(ElementwiseTest, AddAllowsOutputToAliasAnInput) {
  auto ops = MakeCpuOps();
  auto a = Random(kBig, 3), b = Random(kBig, 4);
  const std::vector<float> a0 = a;
  ops->Add(View(a, {kBig}), View(b, {kBig}), View(a, {kBig}));
  for (int64_t i = 0; i < kBig; ++i) ASSERT_EQ(a[i], a0[i] + b[i]) << i;
}

TEST(ElementwiseTest, ZeroAndCopyWorkForEveryDtype) {
  auto ops = MakeCpuOps();
  std::vector<int32_t> ints(kBig, 7), dst(kBig, 0);
  ops->Copy(View(ints, {kBig}), View(dst, {kBig}));
  EXPECT_EQ(dst, ints);
  ops->Zero(View(ints, {kBig}));
  EXPECT_EQ(ints, std::vector<int32_t>(kBig, 0));
  std::vector<uint16_t> halves(5, 0x3c00);
  ops->Zero(Tensor(halves.data(), DType::kF16, {5}));
  EXPECT_EQ(halves, std::vector<uint16_t>(5, 0));
}

TEST(ElementwiseTest, CopyRejectsShapeOrDtypeMismatch) {
  auto ops = MakeCpuOps();
  std::vector<float> a(6), b(6);
  ExpectErrorMentions([&] { ops->Copy(View(a, {2, 3}), View(b, {3, 2})); }, {"Copy", "dst"});
  ExpectErrorMentions([&] { ops->Copy(View(a, {6}), Tensor(b.data(), DType::kI32, {6})); },
                      {"Copy", "dst", "int32"});
}

// Note [Copies beside the ops]: where ops run synchronously a copy beside them is Copy, done
// when CopyBeside returns, with a ticket there is nothing to wait for.
TEST(ElementwiseTest, CopyBesideCopiesAtOnceWhereOpsAreSynchronous) {
  auto ops = MakeCpuOps();
  std::vector<float> src(kBig), dst(kBig, -1.0f);
  for (int64_t i = 0; i < kBig; ++i) src[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i);
  const CopyTicket ticket = ops->CopyBeside(View(src, {kBig}), View(dst, {kBig}));
  EXPECT_EQ(ticket.id, 0u);
  EXPECT_EQ(dst, src);
  ops->WaitCopy(ticket);
  ops->Synchronize();
  ExpectErrorMentions([&] { ops->CopyBeside(View(src, {kBig}), View(dst, {kBig, 1})); },
                      {"Copy", "dst"});
}

TEST(ElementwiseTest, ScaleMultipliesEveryElement) {
  auto ops = MakeCpuOps();
  auto x = Random(kBig, 5);
  const std::vector<float> x0 = x;
  ops->Scale(View(x, {kBig}), -0.25f);
  for (int64_t i = 0; i < kBig; ++i) ASSERT_EQ(x[i], x0[i] * -0.25f) << i;
}

TEST(ElementwiseTest, SumSquaresAccumulatesInDouble) {
  auto ops = MakeCpuOps();
  // 2^24 + many small terms: a float accumulator would drop every 1.0 added to 2^24.
  const int64_t n = 300001;
  std::vector<float> x(n, 1.0f);
  x[0] = 4096.0f;  // 4096^2 = 2^24
  const double got = ops->SumSquares(View(x, {n}));
  EXPECT_EQ(got, 16777216.0 + (n - 1));
  auto r = Random(n, 6);
  double want = 0.0;
  for (float v : r) want += double{v} * v;
  EXPECT_NEAR(ops->SumSquares(View(r, {n})), want, 1e-12 * want);
}

TEST(ElementwiseTest, RejectsNonFloatDtypesNamingThem) {
  auto ops = MakeCpuOps();
  std::vector<uint16_t> raw(4);
  const Tensor u16(raw.data(), DType::kU16, {4}), bf16(raw.data(), DType::kBF16, {4});
  ExpectErrorMentions([&] { ops->SumSquares(u16); }, {"SumSquares", "uint16"});
  ExpectErrorMentions([&] { ops->Scale(u16, 2.0f); }, {"Scale", "uint16"});
  ExpectErrorMentions([&] { ops->AddInPlace(bf16, u16); }, {"AddInPlace", "x", "uint16"});
  ExpectErrorMentions([&] { ops->Zero(Tensor()); }, {"Zero", "undefined"});
}

}  // namespace
}  // namespace ztrain::kernels
