#include "bench/step_bench.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>

#include "bench/bench_util.h"
#include "bench/fma_peak.h"
#include "bench/onednn_peak.h"
#include "core/buffer.h"
#include "engine/engine.h"
#include "estimate/tune.h"
#include "kernels/cpu/blas_kernel.h"
#include "kernels/cpu/onednn_matmul.h"
#include "kernels/cuda_memory.h"
#include "nn/family.h"

namespace ztrain::bench {
namespace {

constexpr int kPeakReps = 5;
constexpr int64_t kOneDnnPeakSize = 2048;

// Best-of-N GFLOP/s of a square SGEMM large enough to reach OpenBLAS's peak.
double SgemmPeakGflops(int n, int reps) {
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  const double best = BestOf(reps, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
  });
  return 2.0 * n * n * n / best / 1e9;
}

// Best-of-N GFLOP/s of a square GEMM of `dtype` tensors through the engine's own ops on its
// device (cuBLAS on a GPU; fp32 accumulation).
double DeviceGemmPeakGflops(Engine& engine, int n, int reps, DType dtype = DType::kF32) {
  MemoryTracker tracker;
  auto alloc = kernels::MakeCudaAllocator(engine.device().index, &tracker);
  std::vector<Buffer> m;
  std::vector<Tensor> t;
  for (int i = 0; i < 3; ++i) {
    m.emplace_back(*alloc, dtype, Shape{n, n}, MemoryCategory::kWorkspace);
    t.push_back(m.back().AsTensor(dtype, {n, n}));
    engine.ops().Zero(t.back());
  }
  const double best = BestOf(reps, [&] {
    engine.ops().Gemm(false, false, 1.0f, t[0], t[1], 0.0f, t[2]);
    engine.ops().Synchronize();
  });
  return 2.0 * n * n * n / best / 1e9;
}

// The fp32 GEMM peak of the engine's device.
double GemmPeakGflops(Engine& engine) {
  return engine.device().is_cpu() ? SgemmPeakGflops(2048, kPeakReps)
                                  : DeviceGemmPeakGflops(engine, 8192, kPeakReps);
}

nlohmann::json ConfigJson(const StepBenchOptions& o, const std::string& precision) {
  nlohmann::json j = DefaultConfigJson();
  j["model"] = o.model;
  j["data"] = {{"seq_len", o.seq}};
  j["train_micro_batch_size_per_gpu"] = o.batch;
  j["gradient_accumulation_steps"] = 1;
  j.erase("train_batch_size");
  j["gradient_clipping"] = 1.0;
  j["device"] = o.device == "cuda" ? "cuda:0" : o.device;
  if (precision != "fp32") j[precision] = {{"enabled", true}};
  if (!o.zero.empty()) j["zero_optimization"] = o.zero;
  return j;
}

// Random tokens and targets, [batch, seq], owned with the micro-batch that views them.
struct Batch {
  std::vector<int32_t> tokens, targets;
  nn::MicroBatch mb;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  Batch(int b, int t, int64_t vocab) : tokens(size_t(b) * t), targets(size_t(b) * t) {
    std::mt19937 rng(1);
    std::uniform_int_distribution<int64_t> tok(0, vocab - 1);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>(tok(rng));
      targets[i] = static_cast<int32_t>(tok(rng));
    }
    mb = {Tensor(tokens.data(), DType::kI32, {b, t}), Tensor(targets.data(), DType::kI32, {b, t})};
  }
};

// PyTorch's step times in one environment, ms.
struct TorchStep {
  double median_ms = 0.0, best_ms = 0.0;
};

// One precision's run, what the report and the summary print.
struct PrecisionRun {
  std::string precision;
  int64_t params = 0;
  double flops = 0.0;  // per step
  std::vector<double> seconds;
  StepStats best_step;
  double gemm_peak = 0.0;    // GFLOP/s, fp32
  double onednn_peak = 0.0;  // GFLOP/s, bf16; 0: not measured
  double device16_peak = 0.0;  // GFLOP/s, cuBLAS in the run's 16-bit dtype; 0: not measured
  FmaLimit fma;  // the CPU cores' limit (bench/fma_peak.h); 0s on a GPU
  MemorySnapshot memory;
  // PyTorch as installed, and with glibc keeping freed memory (kKeepHeapEnv); median 0: not
  // run. The reference the targets name is PyTorch as installed; the faster median is
  // reported beside it, the stricter comparison.
  TorchStep torch_installed, torch_heap_kept;
  std::string torch_version;

  const TorchStep& torch() const {
    const bool kept =
        torch_heap_kept.median_ms > 0 &&
        (torch_installed.median_ms <= 0 || torch_heap_kept.median_ms < torch_installed.median_ms);
    return kept ? torch_heap_kept : torch_installed;
  }
  // ztrain's speed-up over `t`, median/median (0: not run).
  double SpeedUp(const TorchStep& t) const {
    return t.median_ms > 0 ? t.median_ms / (median() * 1e3) : 0.0;
  }

  // The peak the step's matmuls run against: oneDNN's for bf16 on the CPU, cuBLAS's in the
  // 16-bit dtype on a GPU, where measured; else fp32's.
  double matmul_peak() const {
    return onednn_peak > 0 ? onednn_peak : device16_peak > 0 ? device16_peak : gemm_peak;
  }
  std::string matmul_peak_name() const {
    return onednn_peak > 0     ? "oneDNN bf16"
           : device16_peak > 0 ? "cuBLAS " + precision + " GEMM"
                               : "fp32 GEMM";
  }
  // The step if every matmul FLOP ran at matmul_peak() and nothing else took time but the
  // optimizer step (memory-bound, no matmul FLOPs), as the best step measured it.
  double floor_seconds() const {
    return flops / (matmul_peak() * 1e9) + best_step.optimizer_seconds;
  }
  double best() const { return best_step.seconds; }
  double median() const { return Median(seconds); }
  double gflops() const { return flops / best() / 1e9; }
};

// Times `steps` train steps after a warm-up into `run`, with the peaks before and after.
void TimeSteps(Engine& engine, const nn::MicroBatch& mb, int steps, OneDnnPeak* onednn,
               PrecisionRun& run) {
  const bool device16 = !engine.device().is_cpu() && run.precision != "fp32";
  const DType dtype16 = run.precision == "fp16" ? DType::kF16 : DType::kBF16;
  auto measure16 = [&] {
    if (device16) {
      run.device16_peak = std::max(run.device16_peak,
                                   DeviceGemmPeakGflops(engine, 8192, kPeakReps, dtype16));
    }
  };
  auto measure_fma = [&] {
    if (!engine.device().is_cpu()) return;
    const FmaLimit now = MeasureFmaLimit(omp_get_max_threads());
    run.fma.isa = now.isa;
    run.fma.fp32_gflops = std::max(run.fma.fp32_gflops, now.fp32_gflops);
    run.fma.bf16_gflops = std::max(run.fma.bf16_gflops, now.bf16_gflops);
  };
  measure_fma();
  run.gemm_peak = GemmPeakGflops(engine);
  measure16();
  if (onednn) onednn->Measure(kPeakReps);
  engine.TrainStep({&mb, 1});  // warm-up: first touch of activations and caches
  engine.memory().ResetPeaks();
  run.best_step.seconds = 1e30;
  for (int s = 0; s < steps; ++s) {
    const StepStats st = engine.TrainStep({&mb, 1});
    run.seconds.push_back(st.seconds);
    if (st.seconds < run.best_step.seconds) run.best_step = st;
  }
  run.gemm_peak = std::max(run.gemm_peak, GemmPeakGflops(engine));
  measure16();
  measure_fma();
  if (onednn) {
    onednn->Measure(kPeakReps);
    run.onednn_peak = onednn->best();
  }
  run.memory = engine.memory().Snapshot();
}

void PrintMemory(const MemorySnapshot& mem) {
  std::printf("  peak memory (tracker): total %s\n", FormatBytes(mem.total_peak).c_str());
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    if (mem.peak[c] == 0) continue;
    std::printf("    %-16s %s\n",
                std::string(MemoryCategoryName(static_cast<MemoryCategory>(c))).c_str(),
                FormatBytes(mem.peak[c]).c_str());
  }
}

// " (target >= 75%)" for 0.75, "" for no target.
std::string PercentTarget(double target) {
  if (target <= 0) return "";
  char s[32];
  std::snprintf(s, sizeof s, " (target >= %.0f%%)", 100.0 * target);
  return s;
}

// " (target >= 1.8x)" for 1.8, "" for no target.
std::string TimesTarget(double target) {
  if (target <= 0) return "";
  char s[32];
  std::snprintf(s, sizeof s, " (target >= %.1fx)", target);
  return s;
}

// The last line of `out` that starts with '{', parsed; throws when there is none.
nlohmann::json LastJsonLine(const std::string& out) {
  std::istringstream lines(out);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (!line.empty() && line[0] == '{') last = line;
  }
  if (last.empty()) throw std::runtime_error("no JSON line in its output");
  return nlohmann::json::parse(last);
}

// Runs bench/<torch_script> for `precision` under `env` (assignments, may be empty) on
// `threads` threads; says why on stdout and returns zeros when it fails.
TorchStep RunTorchScript(const StepBenchOptions& o, const std::string& precision, int threads,
                         const std::string& env, std::string& version) {
  std::ostringstream cmd;
  cmd << "env " << env << " OMP_NUM_THREADS=" << threads << " '" << o.python
      << "' '" ZTRAIN_BENCH_DIR "/" << o.torch_script << "' --steps " << o.steps << " --batch "
      << o.batch << " --seq " << o.seq << " --layers " << o.model.value("n_layer", 12)
      << " --threads " << threads << " --precision " << precision;
  std::fflush(stdout);  // before the script's stderr, if it says anything
  int status = 0;
  const std::string out = CommandOutput(cmd.str(), &status);
  try {
    if (status != 0) throw std::runtime_error("exit status " + std::to_string(status));
    const nlohmann::json j = LastJsonLine(out);
    version = j.at("torch").get<std::string>();
    return {j.at("step_ms_median").get<double>(), j.at("step_ms_best").get<double>()};
  } catch (const std::exception& e) {
    std::printf("  PyTorch: `%s` failed (%s); no PyTorch reference\n", cmd.str().c_str(), e.what());
    return {};
  }
}

// The PyTorch reference for `precision`, as installed and with the heap kept, into `run`.
void RunTorch(const StepBenchOptions& o, const std::string& precision, int threads,
              PrecisionRun& run) {
  if (o.python.empty() || o.torch_script.empty()) return;
  if (precision != "fp32" && precision != "bf16") {
    std::printf("  PyTorch: no %s autocast on the CPU; no PyTorch reference\n", precision.c_str());
    return;
  }
  if (!PythonHasTorch(o.python)) {
    std::printf(
        "  PyTorch: %s cannot import torch; no PyTorch reference "
        "(apt-get install python3-torch, or --python PATH)\n",
        o.python.c_str());
    return;
  }
  run.torch_installed = RunTorchScript(o, precision, threads, "", run.torch_version);
  run.torch_heap_kept = RunTorchScript(o, precision, threads, kKeepHeapEnv, run.torch_version);
}

void PrintRun(const StepBenchOptions& o, const Engine& engine, const PrecisionRun& r) {
  const bool gpu = !engine.device().is_cpu();
  if (gpu) {
    std::printf("  cuBLAS fp32 GEMM 8192^3 peak (best before/after, same run): %.1f GFLOP/s\n",
                r.gemm_peak);
  } else {
    const char* over = std::getenv(kernels::kChosenOverEnv);  // Note [BLAS kernel]
    std::printf(
        "  OpenBLAS SGEMM 2048^3 peak (best before/after, same run, %s kernels%s%s): "
        "%.1f GFLOP/s\n",
        openblas_get_corename(), over ? ", chosen by ztrain over " : "", over ? over : "",
        r.gemm_peak);
  }
  const StepStats& b = r.best_step;
  std::printf(
      "  train step: median %.1f ms, best %.1f ms of %d (best: forward %.1f, backward "
      "%.1f, grad norm + clip + AdamW %.1f ms)\n",
      r.median() * 1e3, r.best() * 1e3, o.steps, b.forward_seconds * 1e3, b.backward_seconds * 1e3,
      b.optimizer_seconds * 1e3);
  std::printf("  matmul FLOPs per step (Engine::TrainFlopsPerToken x %d tokens): %.1f GFLOP\n",
              o.batch * o.seq, r.flops / 1e9);
  // Backward has twice forward's matmul FLOPs (the engine's 3x convention).
  const double peak = r.matmul_peak() * 1e9;
  std::printf(
      "  by phase (best step, against the %s peak): forward %.1f%%, backward %.1f%%; "
      "the optimizer step is %.1f%% of the step\n",
      r.matmul_peak_name().c_str(),
      100.0 * r.flops / 3.0 / peak / b.forward_seconds,
      100.0 * r.flops * 2.0 / 3.0 / peak / b.backward_seconds,
      100.0 * b.optimizer_seconds / b.seconds);
  const bool fp32 = r.precision == "fp32";
  std::printf("  achieved: %.1f GFLOP/s = %.1f%% of the fp32 GEMM peak%s\n", r.gflops(),
              100.0 * r.gflops() / r.gemm_peak,
              fp32 ? PercentTarget(o.targets.fp32_of_gemm_peak).c_str() : "");
  if (r.fma.fp32_gflops > 0) {
    // The physical limit: fp32 FMAs, or vdpbf16ps for a bf16 step where the CPU has it.
    const bool bf16 = r.precision == "bf16" && r.fma.bf16_gflops > 0;
    const double limit = bf16 ? r.fma.bf16_gflops : r.fma.fp32_gflops;
    std::printf(
        "  FMA limit (%s register loop, %d threads, best before/after): fp32 %.1f GFLOP/s, "
        "bf16 %s; achieved = %.1f%% of the %s limit; the fp32 GEMM peak is %.1f%% of the fp32 "
        "limit\n",
        r.fma.isa.c_str(), omp_get_max_threads(), r.fma.fp32_gflops,
        r.fma.bf16_gflops > 0 ? (std::to_string(static_cast<int>(r.fma.bf16_gflops)) + " GFLOP/s")
                                      .c_str()
                              : "n/a (no AVX512-BF16)",
        100.0 * r.gflops() / limit, bf16 ? "bf16" : "fp32",
        100.0 * r.gemm_peak / r.fma.fp32_gflops);
  }
  if (r.onednn_peak > 0) {
    std::printf(
        "  oneDNN bf16 matmul %lld^3 peak (best before/after, same run): %.1f GFLOP/s; "
        "achieved = %.1f%% of it%s\n",
        static_cast<long long>(kOneDnnPeakSize), r.onednn_peak, 100.0 * r.gflops() / r.onednn_peak,
        PercentTarget(o.targets.bf16_of_onednn_peak).c_str());
  }
  if (r.device16_peak > 0) {
    std::printf(
        "  cuBLAS %s GEMM 8192^3 peak (best before/after, same run): %.1f GFLOP/s; achieved "
        "= %.1f%% of it\n",
        r.precision.c_str(), r.device16_peak, 100.0 * r.gflops() / r.device16_peak);
  }
  if (gpu) {
    const double bf16_peak = o.gpu_bf16_peak_tflops * 1e3;
    std::printf("  tokens/s: %.0f; MFU against the bf16 dense peak (%.0f TFLOP/s): %.1f%%\n",
                o.batch * o.seq / r.best(), o.gpu_bf16_peak_tflops, 100.0 * r.gflops() / bf16_peak);
  }
  PrintMemory(r.memory);
}

void PrintTorch(const StepBenchOptions& o, const PrecisionRun& r) {
  const TorchStep& ref = r.torch();
  if (ref.median_ms <= 0) return;
  const bool fp32 = r.precision == "fp32";
  std::printf(
      "  PyTorch %s, same step (%s), same run, %s, median (best) ms: as installed "
      "%.1f (%.1f), freed memory kept in the heap %.1f (%.1f)\n",
      r.torch_version.c_str(), fp32 ? "fp32" : "bf16 autocast", o.torch_script.c_str(),
      r.torch_installed.median_ms, r.torch_installed.best_ms, r.torch_heap_kept.median_ms,
      r.torch_heap_kept.best_ms);
  if (r.torch_installed.median_ms > 0) {
    std::printf("  ztrain is %.2fx faster than PyTorch as installed (median/median; best/best "
                "%.2fx)%s\n",
                r.SpeedUp(r.torch_installed), r.torch_installed.best_ms / (r.best() * 1e3),
                fp32 ? TimesTarget(o.targets.speedup_over_torch).c_str() : "");
  }
  std::printf(
      "  ztrain is %.2fx faster than the faster PyTorch (median/median; best/best %.2fx)\n",
      r.SpeedUp(ref), ref.best_ms / (r.best() * 1e3));
  std::printf(
      "  floor: the step's matmul FLOPs at the %s peak plus its optimizer step take %.1f ms, "
      "%.2fx faster than this PyTorch at most\n",
      r.matmul_peak_name().c_str(), r.floor_seconds() * 1e3,
      ref.median_ms / (r.floor_seconds() * 1e3));
}

PrecisionRun RunPrecision(const StepBenchOptions& o, const std::string& precision) {
  const Config cfg = ParseConfig(ConfigJson(o, precision));
  PrecisionRun run;
  run.precision = precision;
  const int threads = omp_get_max_threads();
  {
    Engine engine(cfg, nn::BuildModel(cfg.model));
    const Batch batch(o.batch, o.seq, cfg.model.vocab_size);
    std::unique_ptr<OneDnnPeak> onednn;
    if (precision == "bf16" && engine.device().is_cpu()) {
      onednn = std::make_unique<OneDnnPeak>(kOneDnnPeakSize);
      if (!onednn->available()) onednn.reset();
    }
    run.params = engine.NumParameters();
    run.flops = engine.TrainFlopsPerToken(o.seq) * o.batch * o.seq;
    std::printf("\n%s %d layers, %.1fM parameters, B=%d T=%d, %s on %s, %d threads\n",
                o.family.c_str(), cfg.model.n_layer, run.params / 1e6, o.batch, o.seq,
                precision.c_str(), engine.device().ToString().c_str(), threads);
    if (!o.zero.empty()) std::printf("  zero_optimization: %s\n", o.zero.dump().c_str());
    if (precision == "bf16" && engine.device().is_cpu()) {
      std::printf("  bf16 GEMMs: %s\n", kernels::cpu::OneDnnBf16Support().detail.c_str());
    }
    if (engine.device().is_cpu() && !cfg.precision.bf16) {
      // As the trainer does (Note [GEMMs chosen by measurement]).
      engine.UseGemmPlan(ChooseStepGemms(cfg, nullptr));
      std::printf("  fp32 GEMMs: oneDNN on %d of the step's %zu shapes, OpenBLAS on the rest\n",
                  engine.gemm_plan().OnOneDnn(), StepGemmShapes(cfg).size());
    }
    TimeSteps(engine, batch.mb, o.steps, onednn.get(), run);
    PrintRun(o, engine, run);
    if (!engine.device().is_cpu()) return run;
  }
  RunTorch(o, precision, threads, run);
  PrintTorch(o, run);
  return run;
}

// The ratios measured in this run, one line each, against the targets.
void PrintSummary(const StepBenchOptions& o, const std::vector<PrecisionRun>& runs) {
  std::printf("\nsame-run ratios (%s, B=%d T=%d, %d threads):\n", o.family.c_str(), o.batch, o.seq,
              omp_get_max_threads());
  const PrecisionRun& fp32 = runs.front();
  for (const PrecisionRun& r : runs) {
    const bool is_fp32 = &r == &fp32;
    std::printf("  %-5s step %8.1f ms (median)  %7.1f GFLOP/s  %5.1f%% of the fp32 GEMM peak%s\n",
                r.precision.c_str(), r.median() * 1e3, r.gflops(), 100.0 * r.gflops() / r.gemm_peak,
                is_fp32 ? PercentTarget(o.targets.fp32_of_gemm_peak).c_str() : "");
    if (r.onednn_peak > 0) {
      std::printf("        %.1f%% of the oneDNN bf16 matmul peak%s\n",
                  100.0 * r.gflops() / r.onednn_peak,
                  PercentTarget(o.targets.bf16_of_onednn_peak).c_str());
    }
    if (r.device16_peak > 0) {
      std::printf("        %.1f%% of the cuBLAS %s GEMM peak\n", 100.0 * r.gflops() / r.device16_peak,
                  r.precision.c_str());
    }
    if (r.torch().median_ms > 0) {
      std::printf(
          "        %.2fx faster than PyTorch %s as installed%s; %.2fx than its faster run "
          "(heap kept), where the floor allows %.2fx\n",
          r.SpeedUp(r.torch_installed), is_fp32 ? "fp32" : "bf16 autocast",
          is_fp32 ? TimesTarget(o.targets.speedup_over_torch).c_str() : "", r.SpeedUp(r.torch()),
          r.torch().median_ms / (r.floor_seconds() * 1e3));
    }
    if (!is_fp32) {
      std::printf("        %s/fp32 step = %.2f, a %.2fx speed-up\n", r.precision.c_str(),
                  r.median() / fp32.median(), fp32.median() / r.median());
    }
  }
}

}  // namespace

bool ParseStepBenchArgs(int argc, char** argv, StepBenchOptions& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--no-torch") {
      o.python.clear();
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: unknown argument or missing value (see the file's header)\n",
                   arg.c_str());
      return false;
    }
    const std::string value = argv[++i];
    if (arg == "--steps") {
      o.steps = std::stoi(value);
    } else if (arg == "--batch") {
      o.batch = std::stoi(value);
    } else if (arg == "--seq") {
      o.seq = std::stoi(value);
    } else if (arg == "--layers") {
      o.model["n_layer"] = std::stoi(value);
    } else if (arg == "--model-json" || arg == "--zero-json") {
      const nlohmann::json patch = nlohmann::json::parse(value, nullptr, false);
      if (!patch.is_object()) {
        std::fprintf(stderr, "%s: not a JSON object: %s\n", arg.c_str(), value.c_str());
        return false;
      }
      // The model's keys over the bench's (a ~1B shape, say); the zero section whole.
      if (arg == "--model-json") {
        o.model.merge_patch(patch);
      } else {
        o.zero = patch;
      }
    } else if (arg == "--device") {
      o.device = value;
    } else if (arg == "--precision") {
      o.precisions = {"fp32"};
      if (value != "fp32") o.precisions.push_back(value);
    } else if (arg == "--bf16-peak") {
      o.gpu_bf16_peak_tflops = std::stod(value);
    } else if (arg == "--python") {
      o.python = value;
    } else {
      std::fprintf(stderr, "unknown argument %s (see the file's header)\n", arg.c_str());
      return false;
    }
  }
  return true;
}

int RunStepBench(const StepBenchOptions& o) {
  std::vector<PrecisionRun> runs;
  for (const std::string& precision : o.precisions) runs.push_back(RunPrecision(o, precision));
  PrintSummary(o, runs);
  return 0;
}

}  // namespace ztrain::bench
