#pragma once
// The fp32 GEMM backend for each of a model's GEMM shapes, measured on this machine and cached.
//
// Note [GEMMs chosen by measurement]: which fp32 GEMM is faster depends on the shape, the CPU
// and the libraries: oneDNN's fp32 matmul beat OpenBLAS's SGEMM on every shape of the Llama
// ~110M step on the AMD EPYC (14.9 % less GEMM time), while OpenBLAS's kernels are tuned per
// CPU model and win elsewhere. So, as cuBLASLt and PyTorch's cudnn.benchmark do, the engine
// times both backends once on each shape the step runs (estimate/tune.h StepGemmShapes) and keeps
// the faster, oneDNN only when it is at least kOneDnnPays times OpenBLAS's rate (below it,
// noise decides, and OpenBLAS stays). Shapes under kMeasuredFlops are not timed: they take
// microseconds, and OpenBLAS keeps them.
// The choices are cached in a JSON file keyed by everything they depend on (GemmCacheKey: the
// CPU, the OpenBLAS build and kernel, oneDNN's version, the OpenMP threads), so later runs on
// the same machine start without measuring; the file is a cache: deleting it makes the next
// run measure again, and a file that does not parse is measured over and replaced (with a
// warning). Concurrent runs take turns on it through a lock file beside it, and an entry
// already there is kept, not replaced by a second measurement: every run of one machine uses
// the first run's choice. Rank 0 chooses for every rank, and a checkpoint records the plan, so
// a resume computes as the saved run did (run/trainer.cc, run/checkpointer.cc).
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/gemm_plan.h"

namespace ztrain::kernels {

inline constexpr double kOneDnnPays = 1.05;
inline constexpr double kMeasuredFlops = 1e8;

// ZTRAIN_FP32_GEMM: unset or empty or "auto" (the plan decides), "openblas" or "onednn" (every
// shape, whatever the plan says). Anything else throws ztrain::Error naming the three.
enum class Fp32GemmChoice { kAuto, kOpenBlas, kOneDnn };
Fp32GemmChoice Fp32GemmByEnvironment();

// The backend to keep for rates measured on one shape (Note above).
GemmBackend FasterBackend(double openblas_gflops, double onednn_gflops);

// What the choice keys on, as one line: "AMD EPYC (AVX-512 with BF16); OpenBLAS 0.3.21 ...
// USE_OPENMP Cooperlake MAX_THREADS=64, Cooperlake kernel; oneDNN 2.6.3; 2 threads".
std::string GemmCacheKey();
// $ZTRAIN_CACHE_DIR/gemm-choices.json, else $XDG_CACHE_HOME/ztrain/..., else
// $HOME/.cache/ztrain/...; empty when none of them is set.
std::string GemmCachePath();

struct GemmChoice {
  GemmPlan plan;                 // oneDNN where it was chosen, OpenBLAS otherwise
  int measured = 0, cached = 0;  // shapes timed now, shapes read from the cache
  int small = 0;                 // shapes under kMeasuredFlops (OpenBLAS)
  // A step's GEMM seconds on the timed and cached shapes, by their rates and counts: OpenBLAS
  // alone, and the plan.
  double openblas_seconds = 0.0, plan_seconds = 0.0;
  std::string cache_problem;  // why the cache could not be read or written; empty if it was
};

// A shape and how many times a step runs it.
struct CountedShape {
  GemmShape shape;
  int64_t count = 1;
};

// The plan for `shapes` (Note above), reading and updating the cache at `cache_path` (empty:
// no cache). Needs oneDNN in the build; without it every shape is OpenBLAS, unmeasured.
GemmChoice ChooseFp32Gemms(const std::vector<CountedShape>& shapes, const std::string& cache_path);

}  // namespace ztrain::kernels
