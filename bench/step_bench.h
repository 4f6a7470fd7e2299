#pragma once
// The train-step benchmark that gpt2_bench and llama_bench share: one model (a config's
// "model" section) trained through the Engine at batch B and sequence T, timed against
// references measured in the same run, which is what lets its ratios mean something on a
// shared machine:
//  - the fp32 GEMM peak of the engine's device: OpenBLAS SGEMM 2048^3 on the CPU, cuBLAS
//    fp32 8192^3 through the engine's ops on a GPU;
//  - for a bf16 step on the CPU, oneDNN's own bf16 matmul peak at 2048^3 (bench/onednn_peak.h);
//  - on the CPU, the same step in PyTorch: bench/<torch_script> run with `python` on the same
//    number of threads (OMP_NUM_THREADS), printing one JSON line (pytorch_step_util.py);
//    skipped, saying why, when the interpreter has no torch.
// Peaks are measured before and after the steps and the higher kept, so that a burst of load
// from elsewhere during one measurement does not flatter a ratio. FLOPs are the engine's own
// (Engine::TrainFlopsPerToken: 3x the forward matmuls plus causal attention, the convention
// of llm.c and PaLM's MFU); "% of peak" is the best step's rate over the peak, the speed-up
// over PyTorch is the ratio of the median steps. To say where a shortfall lies, the report
// splits the best step into forward and backward (each against the peak, backward having
// twice forward's FLOPs) and the optimizer step, and gives the floor: the step's FLOPs at the
// peak plus its optimizer step (memory-bound, no matmul FLOPs), the fastest the step could be
// at that peak, hence the largest speed-up over PyTorch it allows.
//
// Each precision runs in its own engine, built, timed and freed before the next (so one
// model's state is in memory at a time) and before its PyTorch reference runs. Everything is
// printed on stdout; config and engine errors throw.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ztrain::bench {

// What a family's bench promises (0: no target).
struct StepBenchTargets {
  double fp32_of_gemm_peak = 0.0;    // fp32 step GFLOP/s / the fp32 GEMM peak
  double bf16_of_onednn_peak = 0.0;  // bf16 step GFLOP/s / oneDNN's bf16 matmul peak
  double speedup_over_torch = 0.0;   // PyTorch's fp32 median step (as installed) / ztrain's
};

struct StepBenchOptions {
  std::string family;        // for the report: "GPT-2", "Llama"
  nlohmann::json model;      // the config's "model" section (n_layer is --layers)
  nlohmann::json zero = nlohmann::json::object();  // zero_optimization keys (--zero-json)
  std::string torch_script;  // file in bench/, taking --steps --batch --seq --layers
                             // --threads --precision
  StepBenchTargets targets;
  int steps = 5;
  int batch = 4;
  int seq = 64;
  std::string device = "cpu";  // "cpu" or "cuda" (GPU 0)
  // Timed in this order; a 16-bit one is always timed after fp32 so the two can be compared.
  std::vector<std::string> precisions = {"fp32"};
  std::string python = "/usr/bin/python3";  // has Debian's python3-torch; empty: no PyTorch
  double gpu_bf16_peak_tflops = 989.0;      // MFU on a GPU (H100/H200 SXM dense bf16)
};

// Reads the shared command line into `o` (defaults are what `o` holds):
//   [--steps N] [--batch B] [--seq T] [--layers L] [--model-json '{"n_embd": 2048, ...}']
//   [--zero-json '{"stage": 3, ...}'] [--device cpu|cuda] [--precision fp32|bf16|fp16]
//   [--bf16-peak TFLOP/s] [--python PATH] [--no-torch]
// --precision P other than fp32 times fp32 and P; --model-json's keys replace the model's
// (another shape); --zero-json is the run's zero_optimization section (ZeRO-3 with offload
// against in-GPU, say). False, having said why on stderr, for an argument it does not know.
bool ParseStepBenchArgs(int argc, char** argv, StepBenchOptions& o);

// Builds, times and reports every precision of `o`, then the same-run ratios against the
// targets. Returns the process's exit status (0).
int RunStepBench(const StepBenchOptions& o);

}  // namespace ztrain::bench
