#pragma once
// The ztrain subcommands. Each returns the process exit code; errors propagate as
// exceptions to main(), which reports them.
#include <cstdint>
#include <string>

#include "data/corpus.h"

namespace ztrain::launcher {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitConfigError = 2;
inline constexpr int kExitInterrupted = 130;

// Trains from a config file; an empty path trains the built-in default. Under mpirun (or
// srun, torchrun) with several ranks, trains data-parallel over all of them.
// `ztrain export`: the checkpoint as one model file (checkpoint/checkpoint_export.h).
int RunExport(const std::string& checkpoint, const std::string& format, const std::string& out,
              const std::string& dtype, const std::string& max_shard_size, bool merge,
              bool overwrite);
// `resume`: "" (start fresh unless checkpoint.resume), "latest" or a step to resume from.
int RunTrain(const std::string& config_path, const std::string& resume = "");
// Prints the resolved config (exit 0) or every error found (exit 2); on stderr, where its
// device would put this process on this machine and what a resume (`resume`, check-config's
// --resume, or checkpoint.resume) would resume from.
int RunCheckConfig(const std::string& config_path, int world_size, const std::string& resume);
// `ztrain estimate`: what one rank's memory will peak at, by category, for a config or for
// a GPT-2-shaped model given by size, beside every ZeRO stage and offload choice
// (estimate/estimate.h). Exit 2 with the reason for bad input.
struct EstimateArgs {
  std::string config_path;  // empty: the built-in default with micro-batch 1 and T 1024
  int world_size = 1;
  int gpus_per_node = 8;
  std::string params;       // "7B": a GPT-2-shaped model of that size (needs layers, hidden)
  int layers = 0;
  int64_t hidden = 0;
  int heads = 0;
  int64_t vocab = 0;
  int64_t seq = 0;
  // --seq-len: train at this many tokens per sample (data.seq_len, model.max_seq_len raised to
  // it), and print the context-parallel plan (Note [Context-parallel plan]); 0: the config's.
  int64_t seq_len = 0;
  int64_t micro_batch = 0;  // 0: the config's
  std::string device;       // "", "cpu" or "gpu": where the ranks would train
  std::string gpu_memory;   // "80GiB": also the nodes of gpus_per_node GPUs each row needs
  int max_nodes = 4096;     // the most nodes that search considers
};
int RunEstimate(const EstimateArgs& args);
// `ztrain tune`: the largest train_micro_batch_size_per_gpu that fits `memory_budget` per rank
// (estimate/tune.h), from the estimate and confirmed by one real step when the config is for
// one rank. Prints the sizes tried and the result; exit 2 for bad input, 1 when not even 1
// fits. With `gemm` (`ztrain tune --gemm`), times every GEMM shape of the config's step on
// OpenBLAS and oneDNN (fp32, and bf16 where the CPU has it) instead, and prints the table.
int RunTune(const std::string& config_path, const std::string& memory_budget, int world_size,
            int64_t max_micro_batch, bool gemm = false);
// `ztrain data`: tokenizes a corpus into llm.c shards (data/corpus.h) with a progress line on
// stderr and a summary on stdout; exit 2 for bad input.
int RunData(data::CorpusOptions options);
// `ztrain data --decode SHARD`: the shard's text to `out` ("" or "-": stdout).
int RunDecode(const std::string& shard, const std::string& tokenizer, const std::string& out,
              bool overwrite);
// `ztrain generate`'s options (launcher/main.cc documents each).
struct GenerateArgs {
  std::string model, checkpoint, tokenizer, prompt, prompt_ids;
  int64_t max_new_tokens = 64;
  double temperature = 0;
  int64_t top_k = 0;
  double top_p = 1;
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool ids = false;  // print the new token ids, one a line, instead of text
};
// Prints the prompt and what the model generates after it; the timing goes to the log.
int RunGenerate(const GenerateArgs& args);
// Version and the backends compiled into this binary.
void PrintVersion();

}  // namespace ztrain::launcher
