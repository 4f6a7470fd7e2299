#include "kernels/cpu/bf16_speed.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/onednn_matmul.h"

namespace ztrain::kernels {
namespace {

using ::ztrain::detail::StrCat;
using Clock = std::chrono::steady_clock;

constexpr int64_t kRows = 1024;
constexpr int64_t kMinSide = 512;  // below it a GEMM takes microseconds: timing noise decides
constexpr int64_t kMaxSide = 4096;
constexpr int kReps = 5;

// GFLOP/s of the best of kReps calls of `gemm` (a warm-up first).
template <typename Gemm>
double BestRate(double flops, Gemm gemm) {
  gemm();
  double best = 1e30;
  for (int r = 0; r < kReps; ++r) {
    const auto start = Clock::now();
    gemm();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return flops / best / 1e9;
}

std::string Gflops(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f", v);
  return text;
}

}  // namespace

Bf16Speed MeasureBf16Speed(int64_t width, int64_t mlp_width) {
  Bf16Speed s;
  const cpu::OneDnnSupport& support = cpu::OneDnnBf16Support();
  s.available = support.available;
  s.detail = support.detail;
  if (!s.available) return s;
  s.m = kRows;
  s.k = std::clamp<int64_t>(width, kMinSide, kMaxSide);
  s.n = std::clamp<int64_t>(mlp_width, kMinSide, kMaxSide);
  const size_t a_size = static_cast<size_t>(s.m * s.k), b_size = static_cast<size_t>(s.k * s.n);
  std::vector<float> a(a_size), b(b_size), c(static_cast<size_t>(s.m * s.n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) * 0.125f - 0.375f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 5) * 0.25f - 0.5f;
  std::vector<uint16_t> a16(a_size), b16(b_size);
  for (size_t i = 0; i < a_size; ++i) a16[i] = FloatToBf16(a[i]);
  for (size_t i = 0; i < b_size; ++i) b16[i] = FloatToBf16(b[i]);
  const double flops = 2.0 * static_cast<double>(s.m * s.n * s.k);
  s.fp32_gflops = BestRate(flops, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(s.m),
                static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a.data(),
                static_cast<int>(s.k), b.data(), static_cast<int>(s.n), 0.0f, c.data(),
                static_cast<int>(s.n));
  });
  cpu::OneDnnMatmul matmul;
  cpu::MatmulArgs args;
  args.m = s.m, args.n = s.n, args.k = s.k;
  args.a = a16.data(), args.lda = s.k;
  args.b = b16.data(), args.ldb = s.n;
  args.c = c.data(), args.ldc = s.n;
  bool ran = true;
  s.bf16_gflops = BestRate(flops, [&] { ran = ran && matmul.Run(args); });
  if (!ran) {
    s.available = false;
    s.detail = StrCat("oneDNN has no bf16 matmul for ", s.m, "x", s.k, "x", s.n, " here");
    s.bf16_gflops = 0.0;
  }
  return s;
}

bool Bf16Pays(const Bf16Speed& speed, std::string* why) {
  if (!speed.available) {
    if (why) *why = speed.detail;
    return false;
  }
  const bool pays = speed.ratio() >= kBf16Pays;
  if (why) {
    *why = StrCat("measured on the model's MLP GEMM (", speed.m, "x", speed.k, "x", speed.n,
                  "): bf16 ", Gflops(speed.bf16_gflops), " GFLOP/s against fp32's ",
                  Gflops(speed.fp32_gflops), " (", Gflops(100.0 * speed.ratio()), " %), ",
                  pays ? "so bf16 pays" : "not enough to pay (bf16 needs ",
                  pays ? "" : StrCat(Gflops(100.0 * kBf16Pays), " %)"),
                  "; Note [bf16 where it pays]");
  }
  return pays;
}

}  // namespace ztrain::kernels
