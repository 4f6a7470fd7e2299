#pragma once
// The micro-batch tuner (`ztrain tune`): the largest train_micro_batch_size_per_gpu whose
// per-rank memory fits a budget, found from the estimate (estimate/estimate.h) and confirmed by
// one real train step.
//
// The estimate's device peak grows with the micro-batch (activations are linear in it), so
// the tuner doubles B while the estimate fits and then bisects between the last size that
// fits and the first that does not. It then builds the engine with that B and runs one train
// step on random tokens (gradient_accumulation_steps micro-batches); if the tracker's measured
// peak exceeds the budget after all, it steps B down until a real step fits. The real step
// runs in this process as one rank: for a config of several ranks, the estimate is for one
// rank of that world and the confirmation step is skipped (say so). Not thread safe (it
// trains an engine); errors throw. Also here: the GEMM shapes of a step and their backends
// (`ztrain tune --gemm`, ChooseStepGemms).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "kernels/gemm_plan.h"

namespace ztrain::comm {
class Communicator;
}

namespace ztrain {

struct TuneResult {
  int64_t micro_batch = 0;      // the largest that fits; 0 when even 1 does not
  int64_t estimated_peak = 0;   // its estimated device peak
  int64_t measured_peak = -1;   // the real step's device peak; -1 when not confirmed
  bool confirmed = false;       // a real step ran within the budget
  std::string unconfirmed;      // why no real step ran, when none did
  // Every size tried: (micro-batch, estimated device peak; -1 past Note [Size limits]), in the
  // order tried.
  std::vector<std::pair<int64_t, int64_t>> tried;
};

// `config` with its micro-batch set to `micro_batch` (gradient accumulation kept; the global
// batch follows).
Config WithMicroBatch(const Config& config, int64_t micro_batch);

// The search above, up to `max_micro_batch`; `confirm` runs the real step (one rank only).
TuneResult TuneMicroBatch(const Config& config, int64_t budget_bytes, int64_t max_micro_batch,
                          bool confirm);

// One GEMM shape of a train step on one micro-batch (`ztrain tune --gemm`): the linear, the
// pass (forward, input gradient, weight gradient), the product as CpuOps computes it (forward
// x W^T: NT; input gradient dy W: NN; weight gradient dy^T x: TN), and how many times a step
// runs it (every block's, and Llama's gate and up both).
struct StepGemm {
  std::string linear, pass;
  kernels::GemmShape shape;
  int64_t count = 0;
};
// The distinct shapes of a step's linears (q/k/v fused, attention output, MLP in and out, the
// LM head) from the model's sizes and the micro-batch's tokens; attention's own products and
// tensor-parallel slices are left out.
std::vector<StepGemm> StepGemmShapes(const Config& config);

// Note [GEMMs chosen by measurement] (kernels/cpu/gemm_choice.h) for an engine of `config` on
// the CPU in fp32: rank 0 of `world` (null: this process alone) measures, or reads from its
// cache, the fp32 GEMM backend of each of StepGemmShapes, logging what it chose, and every rank
// returns its plan, so that all compute alike. ZTRAIN_FP32_GEMM set to openblas or onednn on
// rank 0 chooses by hand instead (an empty plan). Collective over `world` whatever each rank's
// environment says.
kernels::GemmPlan ChooseStepGemms(const Config& config, comm::Communicator* world);

// "16GiB", "512 MiB", "2GB", "1e9", "4096": bytes (binary KiB/MiB/GiB/TiB and decimal
// KB/MB/GB/TB, B optional); ConfigError naming the text otherwise.
int64_t ParseBytes(const std::string& text, const std::string& what = "memory budget");

}  // namespace ztrain
