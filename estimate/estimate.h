#pragma once
// Memory estimate: the bytes one rank of a run will hold, per MemoryCategory, known before
// the run (`ztrain estimate`), counted as the engine's MemoryTracker will count them.
//
// EstimateMemory builds the rank's model (any family config.model names, split for its tp
// rank) and runs the Engine itself on it shape-only (Note [Shape-only engine],
// estimate/shape_only.h): construction, initialisation and one train step allocate exactly as
// a real run does, on memory that holds no data, with kernels that compute nothing and
// groups that move nothing; each layer allocates what its own Forward and Backward measured
// (estimate/estimate_layers.h). So the per-category peaks are the tracker's peaks, and the
// total peak is the peak of the sum, not the sum of the peaks. docs/memory.md gives the
// resulting formulas.
//
// Everything the engine does counts: mixed precision, 16-bit gradient accumulation,
// activation checkpointing (from the config, or overridden in EstimateOptions), ZeRO stages,
// offload, pipelines and tensor parallelism; estimate_test and layout_equivalence_test check
// the estimate against the tracker of real runs.
//
// Pure functions of their arguments; thread safe. A config the engine would refuse at start
// (an NVMe parameter shard larger than offload_param.buffer_size, a model tensor parallelism
// cannot split, more pipeline stages than layers) throws ConfigError with the engine's
// reason. The CUDA backend's own limit (tensor parallelism on a GPU) is not refused: the
// estimate says what such a run would need.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/dtype.h"
#include "core/memory_tracker.h"

namespace ztrain {

// What the estimate is for, beyond the config. Unset fields come from the config.
struct EstimateOptions {
  // Train on a GPU (the CUDA backend): model state, activations and buffers in device
  // memory, offloaded state in (pinned) host memory. false: the CPU backend, where all of it
  // is host memory. Default: config.device != "cpu".
  std::optional<bool> gpu;
  // Activation checkpointing: the transformer blocks (0-based) that keep only their input;
  // default config.activation_checkpointing.blocks.
  std::optional<std::vector<int>> checkpointed_blocks;
  // The pipeline stage to estimate; -1: the stage whose total peak is largest.
  int pp_stage = -1;
  // Ranks that share one node's host memory (DeepSpeed's num_gpus_per_node), for the
  // per-node host and NVMe figures; capped at the world size.
  int gpus_per_node = 8;
};

// One rank's memory. "Device" is where the engine computes: the GPU, or host memory on the
// CPU backend (then `host` is empty and everything is under `device`).
struct MemoryEstimate {
  // As the engine's MemoryTracker counts: every category, wherever it lives.
  std::array<int64_t, kNumMemoryCategories> peak{};
  int64_t total_peak = 0;
  std::array<int64_t, kNumMemoryCategories> device_peak{};
  int64_t device_total_peak = 0;
  std::array<int64_t, kNumMemoryCategories> host_peak{};
  int64_t host_total_peak = 0;
  int64_t pinned_host_peak = 0;  // page-locked host memory: pin_memory state, swap buffers
  int64_t nvme_bytes = 0;        // the rank's swap files
  int ranks_per_node = 1;        // min(gpus_per_node, world)

  // The layout the numbers are for.
  int dp = 1, pp = 1, tp = 1, pp_stage = 0, zero_stage = 0;
  int cp = 1;  // context_parallel.size: ZeRO shards over dp x cp
  int64_t micro_batch = 0, seq_len = 0, grad_accum = 0;
  DType compute_dtype = DType::kF32;
  bool gpu = true;
  int checkpointed = 0;          // checkpointed blocks on the stage
  int64_t model_parameters = 0;  // the whole model, each tied weight once
  // This rank's parameter elements (its stage's, its tp slices, without padding): what
  // Engine::NumParameters() returns.
  int64_t rank_parameters = 0;
  int64_t padded_elements = 0;  // the rank's flat buffers summed (Ψ with padding)
  int64_t shard_elements = 0;   // the rank's ZeRO shards summed (padded_elements / dp)

  int64_t Peak(MemoryCategory c) const { return peak[static_cast<int>(c)]; }
  int64_t DevicePeak(MemoryCategory c) const { return device_peak[static_cast<int>(c)]; }
  int64_t HostPeak(MemoryCategory c) const { return host_peak[static_cast<int>(c)]; }
};

MemoryEstimate EstimateMemory(const Config& config, const EstimateOptions& options = {});

// One line of the side-by-side table: a ZeRO stage and offload choice for the same model,
// batch and world, with every block's activations kept and with every block checkpointed.
struct EstimateRow {
  int stage = 0;
  // "none", "optimizer cpu", "optimizer+param cpu" (stage 3), "nvme" (optimizer state, and at
  // stage 3 parameters too, on NVMe).
  std::string offload;
  MemoryEstimate plain;
  MemoryEstimate checkpointed;
};

// Stages 0-3 x the offload choices each allows (offload needs stage >= 1, parameter offload
// stage 3): 11 rows. Other settings (buckets, stage-3 limits, swap buffers, pin_memory) come
// from `config`; overlap_comm is the config's at its own stage and DeepSpeed's default
// (stage 3 only) elsewhere; NVMe rows raise offload_param.buffer_size to the largest shard
// when the config's is smaller (the swap buffers are that large either way).
std::vector<EstimateRow> EstimateTable(const Config& config, const EstimateOptions& options = {});

// A GPT-2-shaped model of about `params` parameters: `layers` blocks of width `hidden`,
// `heads` heads (0: hidden / 64, at least 1), sequence length `seq` (0: base's max_seq_len)
// and vocabulary `vocab` (0: what the remaining parameters hold, at least 1 token).
// `params` 0 with a vocab keeps the shape as given. Throws ConfigError when the blocks alone
// exceed `params` or the shape is impossible.
struct ModelSize {
  int64_t params = 0;
  int layers = 0;
  int64_t hidden = 0;
  int heads = 0;
  int64_t vocab = 0;
  int64_t seq = 0;
};
ModelConfig ModelFromSize(const ModelSize& size, const ModelConfig& base);

// Parameters of a GPT-2 of this shape, tied head counted once: what nn::BuildGpt2 declares.
int64_t Gpt2ParameterCount(const ModelConfig& model);

// "7B", "1.5b", "125M", "350k", "2T", "7e9", "124475904" -> the count; ConfigError naming
// `what` and the text otherwise.
int64_t ParseCount(const std::string& text, const std::string& what = "size");

}  // namespace ztrain
