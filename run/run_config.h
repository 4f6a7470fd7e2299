#pragma once
// Note [A run's config]
// What `ztrain` (train, check-config, estimate, tune) makes of a config file before anything
// runs, in this order, every problem of every step collected into one ConfigError:
//  1. The model's shape from model.init_from: an llm.c model file's header gives n_layer,
//     n_head, n_embd, vocab_size, padded_vocab_size and max_seq_len, so `"model": {"init_from":
//     "gpt2_124M.bin"}` alone is a whole model. A shape key the config gives that disagrees
//     with the file is an error naming both values; one it leaves out (or "auto") is the file's.
//  2. The "auto"s that depend on the machine this process runs on (where the config's device
//     puts it, run/device_select.h): bf16.enabled is true where bf16 is fast (a GPU of
//     compute capability 8.0 or later; on a CPU, oneDNN's bf16 matmul measured at least 1.1x
//     fp32 on the model's MLP GEMM, Note [bf16 where it pays]) or, on a CPU, where only bf16
//     fits (Bf16ForTheRun), unless fp16.enabled is true; train_micro_batch_size_per_gpu is
//     the largest micro-batch whose estimated peak (estimate/estimate.h) fits 90 % of this
//     rank's device memory (a GPU's memory, or the node's memory shared by its ranks), as
//     `ztrain tune` finds it: the other 10 % is for what the estimate does not count (CUDA
//     context, library workspaces, the OS).
//  3. ParseConfig (core/config.h), which resolves every other "auto" (Note [Resolving "auto"]).
// Every value chosen in 1-3 is in Config::auto_choices with its reason; the launcher logs them
// at start and check-config prints them. The checks of the file system come after, in
// Preflight (run/preflight.h).
#include <string>

#include "core/config.h"
#include "parallel/launch_env.h"

namespace ztrain {

// Note [bf16 where it pays], with the memory the run needs: bf16 where it is fast (`fast`, with
// `speed_why` saying why or why not); otherwise bf16 still where the fp32 run's estimated peak
// (at its micro-batch, 1 when that is "auto") does not fit this rank's `budget` and the bf16
// run's does (16-bit activations): slower beats not at all. fp32 where neither fits (the
// micro-batch's resolution or the run names that). `*why`: the reason, with the figures.
struct Bf16Memory {
  int64_t fp32_peak = 0, bf16_peak = 0;  // 0: not estimated (the config has other problems)
  int64_t budget = 0;
  std::string memory;  // what the budget is 90 % of: "23.54 GiB, this rank's share of ..."
};
bool Bf16ForTheRun(bool fast, const std::string& speed_why, const Bf16Memory& m, std::string* why);

// Resolves `j` for this process, which the launcher placed at `launch`, in a world of
// `world_size` ranks.
Config ResolveRunConfig(nlohmann::json j, int world_size, const LaunchEnv& launch);
// Reads the file (an empty path: the built-in default) and resolves it; errors name the file.
Config LoadRunConfig(const std::string& path, int world_size, const LaunchEnv& launch);

}  // namespace ztrain
