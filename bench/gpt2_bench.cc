// GPT-2 124M train step on the CPU (B=4, T=64, fp32), against OpenBLAS SGEMM peak measured in
// the same run; with --device cuda on GPU 0, against cuBLAS's fp32 GEMM peak measured in the
// same run, plus tokens/s and MFU against the GPU's bf16 dense peak (--bf16-peak TFLOP/s,
// default 989: H100/H200 SXM).
//
//   build/bench/gpt2_bench [--steps N] [--batch B] [--seq T] [--layers L] [--device cuda]
//                          [--precision bf16|fp16]
//
// With --precision the model trains in mixed precision, and the same step is then timed in
// fp32 in the same run: the report ends with the 16-bit step time against fp32's.
//
// Prints ms/step, the step's matmul FLOPs (6 x parameters in matmuls per token plus causal
// attention, the convention of llm.c and PaLM's MFU), achieved GFLOP/s as a fraction of the
// SGEMM peak, a forward/backward/optimizer breakdown, and the tracker's peak memory by
// category.
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/buffer.h"
#include "engine/engine.h"
#include "kernels/cuda_memory.h"
#include "nn/gpt2.h"

namespace {

using ztrain::bench::BestOf;
using ztrain::bench::Timer;

// Best-of-N GFLOP/s of a square SGEMM large enough to reach OpenBLAS's peak.
double SgemmPeakGflops(int n, int reps) {
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  const double best = BestOf(reps, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                n, 0.0f, c.data(), n);
  });
  return 2.0 * n * n * n / best / 1e9;
}

// Best-of-N GFLOP/s of a square fp32 GEMM through the engine's own ops on its device
// (cuBLAS on a GPU).
double DeviceGemmPeakGflops(ztrain::Engine& engine, int n, int reps) {
  ztrain::MemoryTracker tracker;
  auto alloc = ztrain::kernels::MakeCudaAllocator(engine.device().index, &tracker);
  std::vector<ztrain::Buffer> m;
  std::vector<ztrain::Tensor> t;
  for (int i = 0; i < 3; ++i) {
    m.emplace_back(*alloc, ztrain::DType::kF32, ztrain::Shape{n, n},
                   ztrain::MemoryCategory::kWorkspace);
    t.push_back(m.back().AsTensor(ztrain::DType::kF32, {n, n}));
    engine.ops().Zero(t.back());
  }
  const double best = BestOf(reps, [&] {
    engine.ops().Gemm(false, false, 1.0f, t[0], t[1], 0.0f, t[2]);
    engine.ops().Synchronize();
  });
  return 2.0 * n * n * n / best / 1e9;
}

int ArgInt(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

std::string ArgString(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = ArgInt(argc, argv, "--steps", 5);
  const int b = ArgInt(argc, argv, "--batch", 4), t = ArgInt(argc, argv, "--seq", 64);
  nlohmann::json j = ztrain::DefaultConfigJson();
  j["model"] = {{"type", "gpt2"}, {"n_layer", ArgInt(argc, argv, "--layers", 12)},
                {"n_head", 12}, {"n_embd", 768}, {"vocab_size", 50257},
                {"padded_vocab_size", 50304}, {"max_seq_len", 1024}};
  j["data"] = {{"seq_len", t}};
  j["train_micro_batch_size_per_gpu"] = b;
  j["gradient_accumulation_steps"] = 1;
  j.erase("train_batch_size");
  j["gradient_clipping"] = 1.0;
  const std::string device = ArgString(argc, argv, "--device", "cpu");
  j["device"] = device == "cuda" ? "cuda:0" : device;
  const std::string precision = ArgString(argc, argv, "--precision", "fp32");
  if (precision != "fp32") j[precision] = {{"enabled", true}};
  const ztrain::Config cfg = ztrain::ParseConfig(j);
  ztrain::Engine engine(cfg, ztrain::nn::BuildGpt2(cfg.model));
  const bool gpu = !engine.device().is_cpu();
  auto gemm_peak = [&] {
    return gpu ? DeviceGemmPeakGflops(engine, 8192, 5) : SgemmPeakGflops(2048, 5);
  };

  std::vector<int32_t> tokens(size_t(b) * t), targets(size_t(b) * t);
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> tok(0, 50256);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = tok(rng), targets[i] = tok(rng);
  ztrain::nn::MicroBatch mb{ztrain::Tensor(tokens.data(), ztrain::DType::kI32, {b, t}),
                            ztrain::Tensor(targets.data(), ztrain::DType::kI32, {b, t})};

  // The reference is measured before and after the steps and the higher figure kept, so a
  // burst of load from elsewhere during one measurement does not flatter the ratio.
  double peak = gemm_peak();
  engine.TrainStep({&mb, 1});  // warm-up: first-touch of activations and caches
  engine.memory().ResetPeaks();
  double best = 1e30, fwd_bwd = 1e30, opt = 1e30;
  for (int s = 0; s < steps; ++s) {
    const ztrain::StepStats st = engine.TrainStep({&mb, 1});
    best = std::min(best, st.seconds);
    // The same step split into its phases (not counted in the step time above).
    Timer phase;
    engine.ZeroGrad();
    engine.ForwardBackward(mb, 1.0f);
    fwd_bwd = std::min(fwd_bwd, phase.Seconds());
    phase.Reset();
    ztrain::StepStats ignored;
    engine.OptimizerStep(engine.GradNorm(), ignored);
    opt = std::min(opt, phase.Seconds());
  }
  peak = std::max(peak, gemm_peak());
  const double flops = engine.TrainFlopsPerToken(t) * b * t;
  const double achieved = flops / best / 1e9;
  std::printf("GPT-2 %d layers, %lld parameters, B=%d T=%d %s on %s\n", cfg.model.n_layer,
              static_cast<long long>(engine.NumParameters()), b, t, precision.c_str(),
              engine.device().ToString().c_str());
  std::printf("%s peak (best before/after, same run): %.1f GFLOP/s\n",
              gpu ? "cuBLAS fp32 GEMM 8192^3" : "OpenBLAS SGEMM 2048^3", peak);
  std::printf("train step: %.1f ms (best of %d); %.1f GFLOP per step\n", best * 1e3, steps,
              flops / 1e9);
  std::printf("  zero grad + forward + backward %.1f ms, grad norm + AdamW %.1f ms\n", fwd_bwd * 1e3, opt * 1e3);
  std::printf("achieved: %.1f GFLOP/s = %.1f%% of the fp32 GEMM peak (target >= 60%%)\n",
              achieved, 100.0 * achieved / peak);
  if (gpu) {
    const double bf16_peak = ArgInt(argc, argv, "--bf16-peak", 989) * 1e3;  // GFLOP/s
    std::printf("tokens/s: %.0f; MFU against the bf16 dense peak (%.0f TFLOP/s): %.1f%%\n",
                b * t / best, bf16_peak / 1e3, 100.0 * achieved / bf16_peak);
  }
  const ztrain::MemorySnapshot mem = engine.memory().Snapshot();
  std::printf("peak memory (tracker): total %s\n", ztrain::FormatBytes(mem.total_peak).c_str());
  for (int c = 0; c < ztrain::kNumMemoryCategories; ++c) {
    if (mem.peak[c] == 0) continue;
    std::printf("  %-16s %s\n",
                std::string(ztrain::MemoryCategoryName(static_cast<ztrain::MemoryCategory>(c))).c_str(),
                ztrain::FormatBytes(mem.peak[c]).c_str());
  }
  if (precision != "fp32") {
    // The same step in fp32, timed in this run.
    nlohmann::json f = j;
    f.erase(precision);
    const ztrain::Config fcfg = ztrain::ParseConfig(f);
    ztrain::Engine fp32(fcfg, ztrain::nn::BuildGpt2(fcfg.model));
    fp32.TrainStep({&mb, 1});
    double fp32_best = 1e30;
    for (int s = 0; s < steps; ++s) fp32_best = std::min(fp32_best, fp32.TrainStep({&mb, 1}).seconds);
    std::printf("%s step %.1f ms, fp32 step %.1f ms (same run): %s/fp32 = %.2f, a %.2fx speed-up\n",
                precision.c_str(), best * 1e3, fp32_best * 1e3, precision.c_str(),
                best / fp32_best, fp32_best / best);
  }
  return 0;
}
