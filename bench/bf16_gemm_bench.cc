// bf16 GEMMs through CpuOps::Gemm at GPT-2 124M's linear-layer shapes (B*T = 4096 rows), against
// two references measured in the same run: oneDNN's own peak on a large square bf16 matmul
// (the primitive called directly, bf16 x bf16 -> fp32; timed before and between the shapes,
// the best run kept), and OpenBLAS SGEMM on the same shape in fp32 (what the CPU backend runs
// without bf16), timed right after the bf16 GEMM.
//
//   build/bench/bf16_gemm_bench [--rows 4096] [--reps 3] [--peak 4096] [--fallback]
//                               [--log-level debug]
//
// Each layer (C in, OC out) gives three GEMMs: forward y = x W^T ([N,C] x [OC,C]^T, bf16 y),
// input gradient dx = dy W ([N,OC] x [OC,C], bf16 dx), weight gradient dW += dy^T x
// ([N,OC]^T x [N,C], accumulated into an fp32 dW, beta = 1). --fallback also times the SGEMM
// fallback on bf16 tensors (Bf16GemmPath::kSgemm); --log-level debug prints the implementation
// oneDNN picked for each shape. Best of --reps after a warm-up; OMP_NUM_THREADS threads.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/onednn_peak.h"
#include "core/logging.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/onednn_matmul.h"
#include "kernels/cpu/blas_kernel.h"

namespace {

using ztrain::DType;
using ztrain::Tensor;
using ztrain::bench::BestOf;
using ztrain::bench::OneDnnPeak;
using ztrain::kernels::Bf16GemmPath;
using ztrain::kernels::CpuOps;

struct Options {
  int64_t rows = 4096;
  int reps = 3;
  int64_t peak = 4096;
  bool fallback = false;
};

// Random values rounded to bf16, kept both as bf16 and as the same values in fp32.
struct Matrix {
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
  Matrix(int64_t n, unsigned seed) : bf16(n), f32(n) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> d(0.0f, 0.5f);
    for (int64_t i = 0; i < n; ++i) {
      bf16[i] = ztrain::FloatToBf16(d(gen));
      f32[i] = ztrain::Bf16ToFloat(bf16[i]);
    }
  }
};

struct GemmCase {
  const char* layer;
  const char* pass;
  bool trans_a, trans_b;
  int64_t m, n, k;
  bool accumulate;  // dW += ...: fp32 c, beta = 1; else a bf16 c, beta = 0
};

std::vector<GemmCase> Gpt2Cases(int64_t rows) {
  struct Layer {
    const char* name;
    int64_t c, oc;
  };
  const Layer layers[] = {{"qkv 768x2304", 768, 2304},
                          {"attn proj 768x768", 768, 768},
                          {"mlp fc 768x3072", 768, 3072},
                          {"mlp proj 3072x768", 3072, 768},
                          {"lm head 768x50304", 768, 50304}};
  std::vector<GemmCase> cases;
  for (const Layer& l : layers) {
    cases.push_back({l.name, "fwd  y=xW^T", false, true, rows, l.oc, l.c, false});
    cases.push_back({l.name, "bwd dx=dyW", false, false, rows, l.c, l.oc, false});
    cases.push_back({l.name, "bwd dW+=dy^Tx", true, false, l.oc, l.c, rows, true});
  }
  return cases;
}

struct Rates {
  double bf16, sgemm, fallback, peak;
};

Rates Measure(const GemmCase& g, CpuOps& ops, CpuOps* fallback, int reps) {
  const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  const Matrix a(a_rows * a_cols, 3), b(b_rows * b_cols, 4);
  const DType c_type = g.accumulate ? DType::kF32 : DType::kBF16;
  const float beta = g.accumulate ? 1.0f : 0.0f;
  std::vector<float> c(g.m * g.n, 0.0f);  // room for an fp32 c; a bf16 c uses half
  const Tensor ta(const_cast<uint16_t*>(a.bf16.data()), DType::kBF16, {a_rows, a_cols});
  const Tensor tb(const_cast<uint16_t*>(b.bf16.data()), DType::kBF16, {b_rows, b_cols});
  const Tensor tc(c.data(), c_type, {g.m, g.n});
  const double flops = 2.0 * g.m * g.n * g.k;
  Rates r{};
  r.bf16 =
      flops / BestOf(reps, [&] { ops.Gemm(g.trans_a, g.trans_b, 1.0f, ta, tb, beta, tc); }) / 1e9;
  if (fallback) {
    r.fallback =
        flops /
        BestOf(reps, [&] { fallback->Gemm(g.trans_a, g.trans_b, 1.0f, ta, tb, beta, tc); }) / 1e9;
  }
  std::vector<float> c32(g.m * g.n, 0.0f);
  r.sgemm = flops /
            BestOf(reps,
                   [&] {
                     cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                                 g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, 1.0f,
                                 a.f32.data(), a_cols, b.f32.data(), b_cols, beta, c32.data(), g.n);
                   }) /
            1e9;
  return r;
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (arg == "--rows") {
      o.rows = std::stoll(next());
    } else if (arg == "--reps") {
      o.reps = std::stoi(next());
    } else if (arg == "--peak") {
      o.peak = std::stoll(next());
    } else if (arg == "--fallback") {
      o.fallback = true;
    } else if (arg == "--log-level") {
      ztrain::SetLogLevel(next());
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  ztrain::kernels::RestartWithBestBlasKernel(argv);  // Note [BLAS kernel]
  const Options opt = Parse(argc, argv);
  CpuOps ops;
  CpuOps fallback(Bf16GemmPath::kSgemm);
  std::printf(
      "bf16 GEMMs through CpuOps::Gemm, GPT-2 124M shapes with %lld rows, %d threads, "
      "best of %d\n",
      static_cast<long long>(opt.rows), omp_get_max_threads(), opt.reps);
  std::printf("bf16 GEMM path: %s (%s)\n", ops.Bf16GemmsOnOneDnn() ? "oneDNN" : "SGEMM fallback",
              ztrain::kernels::cpu::OneDnnBf16Support().detail.c_str());
  OneDnnPeak peak(opt.peak);
  if (peak.available()) {
    std::printf("oneDNN peak reference: %lld^3 bf16 matmul, %s\n", static_cast<long long>(opt.peak),
                peak.impl_name().c_str());
  } else {
    std::printf("oneDNN bf16 peak: not measured (this build has no oneDNN)\n");
  }
  std::printf("\n%-20s %-14s %5s %6s %6s %10s %9s %10s %8s%s\n", "layer", "pass", "M", "N", "K",
              "bf16 GF/s", "of peak", "SGEMM GF/s", "vs SGEMM",
              opt.fallback ? "  fallback GF/s" : "");
  double bf16_time = 0, sgemm_time = 0;
  std::vector<std::pair<GemmCase, Rates>> results;
  for (const GemmCase& g : Gpt2Cases(opt.rows)) {
    results.emplace_back(g, Measure(g, ops, opt.fallback ? &fallback : nullptr, opt.reps));
    results.back().second.peak = peak.Measure(opt.reps);
  }
  for (const auto& [g, r] : results) {
    const double flops = 2.0 * g.m * g.n * g.k / 1e9;
    bf16_time += flops / r.bf16;
    sgemm_time += flops / r.sgemm;
    std::printf("%-20s %-14s %5lld %6lld %6lld %10.1f %8.0f%% %10.1f %7.2fx", g.layer, g.pass,
                static_cast<long long>(g.m), static_cast<long long>(g.n),
                static_cast<long long>(g.k), r.bf16, r.peak > 0 ? 100.0 * r.bf16 / r.peak : 0.0,
                r.sgemm, r.bf16 / r.sgemm);
    if (opt.fallback) std::printf(" %14.1f", r.fallback);
    std::printf("\n");
  }
  if (peak.available()) {
    std::printf(
        "\noneDNN bf16 peak (%lld^3 matmul): best %.1f GFLOP/s; \"of peak\" divides by "
        "the peak timed right after each shape\n",
        static_cast<long long>(opt.peak), peak.best());
  }
  std::printf(
      "all 15 GEMMs (one layer of each kind + the LM head, forward and backward): "
      "bf16 %.3f s, SGEMM %.3f s: %.2fx\n",
      bf16_time, sgemm_time, sgemm_time / bf16_time);
  return 0;
}
