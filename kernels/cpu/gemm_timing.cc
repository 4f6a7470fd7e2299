#include "kernels/cpu/gemm_timing.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/onednn_matmul.h"

namespace ztrain::kernels {
namespace {

using Clock = std::chrono::steady_clock;

// GFLOP/s of the best of `reps` calls of `gemm` after a warm-up; 0 when it says it did not run.
template <typename Gemm>
double BestRate(double flops, int reps, Gemm gemm) {
  if (!gemm()) return 0.0;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    gemm();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return flops / best / 1e9;
}

}  // namespace

GemmRates TimeGemm(const GemmShape& shape, GemmBackends backends, int reps) {
  const int64_t m = shape.m, n = shape.n, k = shape.k;
  const int64_t lda = shape.trans_a ? m : k, ldb = shape.trans_b ? k : n;
  const size_t a_size = static_cast<size_t>(m * k), b_size = static_cast<size_t>(k * n);
  std::vector<float> a(a_size), b(b_size), c(static_cast<size_t>(m * n));
  for (size_t i = 0; i < a_size; ++i) a[i] = static_cast<float>(i % 7) * 0.125f - 0.375f;
  for (size_t i = 0; i < b_size; ++i) b[i] = static_cast<float>(i % 5) * 0.25f - 0.5f;
  const double flops = shape.flops();
  GemmRates rates;
  rates.sgemm = BestRate(flops, reps, [&] {
    cblas_sgemm(CblasRowMajor, shape.trans_a ? CblasTrans : CblasNoTrans,
                shape.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a.data(), static_cast<int>(lda), b.data(),
                static_cast<int>(ldb), 0.0f, c.data(), static_cast<int>(n));
    return true;
  });
  if (!cpu::OneDnnBuiltIn() || !(backends.onednn_fp32 || backends.onednn_bf16)) return rates;
  cpu::OneDnnMatmul matmul;
  cpu::MatmulArgs args;
  args.trans_a = shape.trans_a, args.trans_b = shape.trans_b;
  args.m = m, args.n = n, args.k = k;
  args.lda = lda, args.ldb = ldb, args.ldc = n;
  args.c = c.data();
  if (backends.onednn_fp32) {
    args.ab_type = DType::kF32;
    args.a = a.data(), args.b = b.data();
    rates.onednn_fp32 = BestRate(flops, reps, [&] { return matmul.Run(args); });
  }
  if (backends.onednn_bf16) {
    std::vector<uint16_t> a16(a_size), b16(b_size);
    for (size_t i = 0; i < a_size; ++i) a16[i] = FloatToBf16(a[i]);
    for (size_t i = 0; i < b_size; ++i) b16[i] = FloatToBf16(b[i]);
    args.ab_type = DType::kBF16;
    args.a = a16.data(), args.b = b16.data();
    rates.onednn_bf16 = BestRate(flops, reps, [&] { return matmul.Run(args); });
  }
  return rates;
}

}  // namespace ztrain::kernels
