// The ztrain executable: parses the command line, runs a subcommand, and is the only place
// that catches errors and ends the process (DESIGN.md "Errors").
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/logging.h"
#include "kernels/cpu/blas_kernel.h"
#include "launcher/cli_checks.h"
#include "launcher/commands.h"

namespace {

int Main(int argc, char** argv) {
  using namespace ztrain::launcher;
  CLI::App app{"ztrain: DeepSpeed-style transformer training in one C++ binary", "ztrain"};
  app.require_subcommand(0, 1);
  std::string config_path, log_level = "info";
  bool version = false;
  app.add_option("--config", config_path, "DeepSpeed-style JSON config (default: built-in)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off");
  app.add_flag("--version", version, "print the version and the backends of this build");

  std::string resume;
  const char* resume_help =
      "resume from checkpoint.dir: 'latest' (the default; the newest intact checkpoint) or a "
      "step (20 or step20)";
  app.add_option("--resume", resume, resume_help)->expected(0, 1)->default_str("latest");
  CLI::App* train = app.add_subcommand("train", "train a model (the default command)");
  train->add_option("--config", config_path, "DeepSpeed-style JSON config (default: built-in)");
  train->add_option("--resume", resume, resume_help)->expected(0, 1)->default_str("latest");

  CLI::App* check = app.add_subcommand("check-config", "print the resolved config or its errors");
  std::string check_path;
  int world_size = 1;
  check->add_option("file", check_path, "config file")->required();
  check->add_option("--world-size", world_size, "data-parallel ranks to validate the batch for")
      ->check(kPositive);
  std::string check_resume;
  check->add_option("--resume", check_resume,
                    "check what train --resume would resume from ('latest' or step<N>)")
      ->expected(0, 1)
      ->default_str("latest");

  CLI::App* est = app.add_subcommand(
      "estimate", "per-rank memory by category before a run, beside every ZeRO stage and offload");
  EstimateArgs estimate;
  est->add_option("--config", estimate.config_path, "DeepSpeed-style JSON config");
  est->add_option("--world-size", estimate.world_size, "ranks in all (dp x pp x tp)")
      ->check(kPositive);
  est->add_option("--gpus-per-node", estimate.gpus_per_node,
                  "ranks sharing a node's host memory (default 8)")
      ->check(kPositive);
  est->add_option("--params", estimate.params,
                  "a GPT-2-shaped model of this size instead of the config's: 7B, 1.5B, 350M");
  est->add_option("--layers", estimate.layers, "its transformer blocks")->check(kPositive);
  est->add_option("--hidden", estimate.hidden, "its width (n_embd)")->check(kPositive);
  est->add_option("--heads", estimate.heads, "its attention heads (default hidden / 64)")
      ->check(kPositive);
  est->add_option("--vocab", estimate.vocab,
                  "its vocabulary (default: what --params leaves after the blocks)")
      ->check(kPositive);
  est->add_option("--seq", estimate.seq, "its context and sequence length")->check(kPositive);
  est->add_option("--micro-batch", estimate.micro_batch, "train_micro_batch_size_per_gpu")
      ->check(kPositive);
  est->add_option("--seq-len", estimate.seq_len,
                  "train at this many tokens per sample (data.seq_len; model.max_seq_len raised "
                  "to it), and print which context_parallel sizes fit (with --gpu-memory)")
      ->check(kPositive);
  est->add_option("--gpu-memory", estimate.gpu_memory,
                  "memory of one GPU (80GiB, 40GB): also print the nodes of --gpus-per-node "
                  "GPUs each stage and offload choice needs");
  est->add_option("--max-nodes", estimate.max_nodes, "the most nodes to consider (default 4096)")
      ->check(kPositive);
  est->add_option("--device", estimate.device,
                  "gpu or cpu: where the ranks train (default: the config's device; auto is gpu)")
      ->check(CLI::IsMember({"gpu", "cpu"}));

  CLI::App* tune = app.add_subcommand(
      "tune", "the largest micro-batch that fits a memory budget, confirmed by one real step");
  std::string tune_config, tune_budget;
  int tune_world = 1;
  int64_t tune_max = 4096;
  tune->add_option("--config", tune_config, "DeepSpeed-style JSON config")->required();
  tune->add_option("--memory-budget", tune_budget, "bytes per rank: 16GiB, 512MiB, 2GB");
  bool tune_gemm = false;
  tune->add_flag("--gemm", tune_gemm,
                 "time the config's GEMM shapes on OpenBLAS and oneDNN instead (GFLOP/s table)");
  tune->add_option("--world-size", tune_world, "ranks in all (dp x pp x tp)")->check(kPositive);
  tune->add_option("--max-micro-batch", tune_max, "the largest size to consider (default 4096)")
      ->check(kPositive);

  CLI::App* data = app.add_subcommand(
      "data", "tokenize text and JSONL files into llm.c token shards, or decode a shard");
  ztrain::data::CorpusOptions corpus;
  std::vector<std::string> text_inputs;
  std::string decode_shard;
  data->add_option("inputs", corpus.inputs,
                   "text or JSONL files, globs (quoted) or directories, in order");
  data->add_option("--text", text_inputs, "an input file, as the positional ones");
  data->add_option("--out", corpus.out,
                   "the shard to write (.bin); a larger corpus is split into <stem>_000000.bin, "
                   "... (with --decode: the text file, default stdout)");
  data->add_option("--tokenizer", corpus.tokenizer,
                   "a Hugging Face tokenizer.json, a SentencePiece .model, or the model "
                   "directory holding one (default: byte tokens)");
  data->add_option("--jsonl-key", corpus.jsonl_key,
                   "the JSONL field holding each document's text (default text)");
  data->add_option("--input-format", corpus.input_format,
                   "auto (.jsonl and .ndjson files are JSONL, others text), text or jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}));
  data->add_option("--shard-tokens", corpus.shard_tokens,
                   "tokens per shard (default 100000000, as llm.c)")
      ->check(kPositive);
  data->add_option("--val-tokens", corpus.val_tokens,
                   "put the first whole documents, at least this many tokens, in a validation "
                   "split <stem>.val.bin (default 0: none)")
      ->check(kNonNegative);
  data->add_option("--bos", corpus.bos,
                   "the token before each document: auto (as the tokenizer's config says), "
                   "none, or a token such as '<s>'");
  data->add_option("--eos", corpus.eos,
                   "the token after each document: auto, none, or a token such as '</s>'");
  data->add_option("--invalid-utf8", corpus.invalid_utf8,
                   "replace (with U+FFFD, counted and reported; the default) or error")
      ->check(CLI::IsMember({"replace", "error"}));
  data->add_option("--threads", corpus.threads, "encoding threads (default: every core)")
      ->check(kNonNegative);
  data->add_option("--token-format", corpus.token_format,
                   "auto (uint16 when the tokenizer's ids fit, else uint32), uint16 (llm.c's "
                   "gpt-2 shards) or uint32 (llm.c's llama-3 shards)")
      ->check(CLI::IsMember({"auto", "uint16", "uint32"}));
  data->add_option("--decode", decode_shard,
                   "write the text of this shard (with --tokenizer's vocabulary) instead");
  data->add_flag("--allow-binary", corpus.allow_binary,
                 "tokenize inputs that look binary (a NUL byte in their first 64 KiB), which "
                 "are refused otherwise");
  data->add_flag("--overwrite", corpus.overwrite,
                 "replace an earlier corpus at --out (its shards and manifest), or with "
                 "--decode an existing text file; without it they are refused");

  CLI::App* gen = app.add_subcommand(
      "generate", "sample text from a model directory, an llm.c model file or a checkpoint");
  GenerateArgs generate;
  gen->add_option("--model", generate.model,
                  "a Hugging Face model directory or an llm.c model file");
  gen->add_option("--checkpoint", generate.checkpoint,
                  "a checkpoint (<checkpoint.dir>/step<N>) or checkpoint.dir (its latest); a "
                  "LoRA run's is merged");
  gen->add_option("--tokenizer", generate.tokenizer,
                  "tokenizer.json, a SentencePiece .model or a directory (default: --model's "
                  "directory when it holds one, else byte tokens)");
  CLI::Option* prompt_text = gen->add_option("--prompt", generate.prompt, "the text to continue");
  gen->add_option("--prompt-ids", generate.prompt_ids,
                  "the prompt as token ids, e.g. 50256,464 (instead of --prompt)")
      ->excludes(prompt_text);
  gen->add_option("--max-new-tokens", generate.max_new_tokens, "tokens to generate (default 64)")
      ->check(kNonNegative);
  gen->add_option("--temperature", generate.temperature,
                  "0 (the default): greedy; above 0: sample at this temperature")
      ->check(kNonNegative);
  gen->add_option("--top-k", generate.top_k, "sample from the k most likely (default 0: all)")
      ->check(kNonNegative);
  gen->add_option("--top-p", generate.top_p,
                  "sample from the smallest set of probability >= p (default 1: all)")
      ->check(kProbability);
  gen->add_option("--seed", generate.seed, "the sampling seed (default 0)");
  gen->add_flag("--ignore-eos", generate.ignore_eos,
                "go on past the end-of-text token (default: stop there)");
  gen->add_flag("--ids", generate.ids, "print the new token ids, one a line, instead of text");

  CLI::App* exp = app.add_subcommand("export", "write a model from a checkpoint");
  std::string export_checkpoint, export_format, export_out, export_dtype = "fp32";
  std::string export_shard = "5GB";
  bool export_merge = false, export_overwrite = false;
  exp->add_option("--checkpoint", export_checkpoint,
                  "a checkpoint (<checkpoint.dir>/step<N>) or checkpoint.dir (its latest)")
      ->required();
  exp->add_option("--format", export_format,
                  "hf (a Hugging Face model directory, any model.type), llmc (llm.c's model "
                  "file, GPT-2), safetensors (one Hugging Face GPT-2 file, config.json beside "
                  "it) or peft (a LoRA run's adapter: adapter_config.json, "
                  "adapter_model.safetensors)")
      ->required()
      ->check(CLI::IsMember({"hf", "llmc", "safetensors", "peft"}));
  exp->add_flag("--merge", export_merge,
                "hf from a LoRA run: the base with each adapter's scaling B A added, trained "
                "biases and modules in place (PEFT's merge_and_unload)");
  exp->add_option("--out", export_out, "the directory (hf) or model file to write")->required();
  exp->add_flag("--overwrite", export_overwrite,
                "replace an --out that already holds files (the new export takes its place "
                "only once it is whole); without it such an --out is refused");
  exp->add_option("--dtype", export_dtype, "fp32 or bf16 (hf: also fp16)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  exp->add_option("--max-shard-size", export_shard,
                  "hf: the largest safetensors file, as save_pretrained's max_shard_size "
                  "(5GB, 500MB, 2GiB, bytes); larger models are sharded with an index");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitConfigError;
  }
  ztrain::SetLogLevel(log_level);
  if (version) {
    PrintVersion();
    return kExitOk;
  }
  if (*check) return RunCheckConfig(check_path, world_size, check_resume);
  if (*est) return RunEstimate(estimate);
  if (*tune) return RunTune(tune_config, tune_budget, tune_world, tune_max, tune_gemm);
  if (*data) {
    if (!decode_shard.empty()) {
      return RunDecode(decode_shard, corpus.tokenizer, corpus.out, corpus.overwrite);
    }
    corpus.inputs.insert(corpus.inputs.begin(), text_inputs.begin(), text_inputs.end());
    return RunData(std::move(corpus));
  }
  if (*gen) return RunGenerate(generate);
  if (*exp) {
    return RunExport(export_checkpoint, export_format, export_out, export_dtype, export_shard,
                     export_merge, export_overwrite);
  }
  return RunTrain(config_path, resume);
}

}  // namespace

int main(int argc, char** argv) {
  // Note [BLAS kernel]: OpenBLAS chose its kernel when it loaded; one below the CPU is
  // replaced by starting again with OPENBLAS_CORETYPE set (the trainer logs which).
  ztrain::kernels::RestartWithBestBlasKernel(argv);
  try {
    return Main(argc, argv);
  } catch (const ztrain::ConfigError& e) {
    std::fprintf(stderr, "ztrain: config error:\n%s\n", e.what());
    return ztrain::launcher::kExitConfigError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ztrain: error: %s\n", e.what());
    return ztrain::launcher::kExitError;
  }
}
