#include "launcher/commands.h"

#include <omp.h>

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_export.h"
#include "core/config.h"
#include "core/logging.h"
#include "estimate/estimate.h"
#include "estimate/tune.h"
#include "kernels/cpu/blas_kernel.h"
#include "kernels/cpu/gemm_choice.h"
#include "kernels/cpu/gemm_timing.h"
#include "kernels/cpu/onednn_matmul.h"
#include "kernels/ops.h"
#include "launcher/build_info.h"
#include "launcher/signals.h"
#include "launcher/slurm_job.h"
#include "parallel/comm/mpi/mpi_communicator.h"
#include "parallel/launch_env.h"
#include "run/device_select.h"
#include "run/preflight.h"
#include "run/run_config.h"
#include "run/trainer.h"

namespace ztrain::launcher {

namespace {

namespace fs = std::filesystem;

// Ranks on one node would each start one OpenMP thread per core and fight over the cores.
// Unless the user chose OMP_NUM_THREADS, a rank gets the CPUs SLURM gave its task
// (SLURM_CPUS_PER_TASK, as srun -c / --cpus-per-task sets it), else its share of the node's
// cores (as torchrun does).
void SetThreadsPerRank(const LaunchEnv& env) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return;
  if (env.cpus_per_task > 0) {
    omp_set_num_threads(env.cpus_per_task);
    Log().info("{} OpenMP threads per rank from SLURM_CPUS_PER_TASK (set OMP_NUM_THREADS to "
               "override)",
               env.cpus_per_task);
    return;
  }
  if (env.local_size <= 1) return;
  const int threads = std::max(1, omp_get_num_procs() / env.local_size);
  omp_set_num_threads(threads);
  Log().info("{} ranks on this node: {} OpenMP threads each (set OMP_NUM_THREADS to override)",
             env.local_size, threads);
}

Config LoadTrainConfig(const std::string& config_path, const LaunchEnv& env) {
  if (config_path.empty()) Log().info("no --config given: training the built-in default model");
  return LoadRunConfig(config_path, env.world_size, env);
}

int Train(Config config, comm::Communicator* world, const LaunchEnv& env,
          const std::string& resume) {
  const std::atomic<bool>& stop = InstallStopHandlers();
  LogSlurmJob(env);
  std::string tag = resume;
  if (tag.empty() && (config.checkpoint.resume || ResumesAfterRequeue(env, config))) {
    tag = "latest";
  }
  const bool requeues = RequeuesOnUsr1(env, config);
  Trainer trainer(std::move(config), world, env);
  // An explicit --resume means resume: a checkpoint.dir holding none is an error then.
  if (!tag.empty()) trainer.Resume(tag, /*required=*/!resume.empty());
  const TrainSummary summary = trainer.Run(&stop);
  if (!summary.interrupted) return kExitOk;
  // The ranks agree (SIGUSR1 may have reached only some), and this collective also means
  // every rank's checkpoint files are written before SLURM ends the job's processes.
  float requeue = requeues && StopSignal() == SIGUSR1 ? 1.0f : 0.0f;
  if (world != nullptr) {
    world->AllReduce(Tensor(&requeue, DType::kF32, {1}), comm::ReduceOp::kMax)->Wait();
  }
  if (requeue > 0.0f && (world == nullptr || world->rank() == 0)) {
    const std::string problem = RequeueSlurmJob(env.slurm_job_id);
    if (problem.empty()) {
      Log().warn("requeued SLURM job {}: it resumes from the checkpoint just saved",
                 env.slurm_job_id);
    } else {
      Log().error("{}", problem);
    }
  }
  return kExitInterrupted;
}

// Where `setting` would put this process (a rank of `world_size` outside a launcher), on
// stderr so that stdout stays the JSON. A device this machine lacks is not a config error:
// the config may be checked where it does not run.
void PrintDeviceChoice(const std::string& setting, int world_size) {
  try {
    LaunchEnv env = DetectLaunchEnv();
    if (env.launcher == "none") env.world_size = world_size;
    const DeviceChoice choice = SelectDevice(setting, env);
    std::fprintf(stderr, "device on this machine: %s (%s)\n", choice.device.ToString().c_str(),
                 choice.reason.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "device on this machine: not usable here: %s\n", e.what());
  }
}

// The config `ztrain estimate` describes: the file (or the built-in default, with one
// sequence of 1024 tokens per micro-batch), the model replaced when given by size.
Config EstimateConfig(const EstimateArgs& a) {
  const bool by_size = !a.params.empty() || a.layers > 0 || a.hidden > 0;
  ZTRAIN_CHECK_T(ConfigError, !a.config_path.empty() || by_size,
                 "ztrain estimate needs --config FILE or a model size, e.g. --params 7B "
                 "--layers 32 --hidden 4096");
  const LaunchEnv env = DetectLaunchEnv();
  nlohmann::json j = a.config_path.empty() ? DefaultConfigJson() : ReadConfigJson(a.config_path);
  if (a.config_path.empty()) {
    j["train_micro_batch_size_per_gpu"] = 1;
    j["model"]["max_seq_len"] = 1024;
  }
  if (a.micro_batch > 0) {  // the global batch follows
    j["train_micro_batch_size_per_gpu"] = a.micro_batch;
    j.erase("train_batch_size");
  }
  if (by_size) {
    const Config base = ResolveRunConfig(j, a.world_size, env);
    const ModelSize size{.params = a.params.empty() ? 0 : ParseCount(a.params, "--params"),
                         .layers = a.layers,
                         .hidden = a.hidden,
                         .heads = a.heads,
                         .vocab = a.vocab,
                         .seq = a.seq};
    const ModelConfig m = ModelFromSize(size, base.model);
    j["model"] = {{"type", "gpt2"},
                  {"n_layer", m.n_layer},
                  {"n_head", m.n_head},
                  {"n_embd", m.n_embd},
                  {"vocab_size", m.vocab_size},
                  {"padded_vocab_size", m.padded_vocab_size},
                  {"max_seq_len", m.max_seq_len}};
    if (a.seq > 0 || base.data.seq_len > m.max_seq_len) j["data"]["seq_len"] = m.max_seq_len;
    if (size.params > 0 && size.vocab > 0) {
      std::fprintf(stderr,
                   "ztrain estimate: --vocab given, so the shape decides the size: %s "
                   "parameters (--params said %s)\n",
                   std::to_string(Gpt2ParameterCount(m)).c_str(), a.params.c_str());
    }
  }
  if (a.seq_len > 0) {
    j["data"]["seq_len"] = a.seq_len;
    const nlohmann::json& max = j["model"]["max_seq_len"];
    if (!max.is_number_integer() || max.get<int64_t>() < a.seq_len) {
      j["model"]["max_seq_len"] = a.seq_len;
    }
  }
  return ResolveRunConfig(j, a.world_size, env);
}

std::string Count(int64_t n) {
  char buf[32];
  if (n >= 1000000000) {
    std::snprintf(buf, sizeof buf, "%.2fB", static_cast<double>(n) / 1e9);
  } else {
    std::snprintf(buf, sizeof buf, "%.2fM", static_cast<double>(n) / 1e6);
  }
  return buf;
}

std::string OffloadName(const Config& c) {
  const std::string opt = c.zero.offload_optimizer.device, par = c.zero.offload_param.device;
  return "offload_optimizer " + opt + ", offload_param " + (c.zero.stage == 3 ? par : "none");
}

void PrintEstimateHeader(const Config& c, const MemoryEstimate& e) {
  const ModelConfig& m = c.model;
  const std::string heads =
      m.kv_heads() == m.n_head ? std::to_string(m.n_head) + " heads"
                               : std::to_string(m.n_head) + " heads over " +
                                     std::to_string(m.kv_heads()) + " key/value heads";
  std::printf(
      "model: %s of %s parameters (%d blocks, n_embd %d, %s, MLP %lld, vocabulary %lld "
      "padded to %lld, context %lld)\n",
      m.type == "gpt2" ? "GPT-2" : m.type.c_str(), Count(e.model_parameters).c_str(), m.n_layer,
      m.n_embd, heads.c_str(), static_cast<long long>(m.mlp_hidden()),
      static_cast<long long>(m.vocab_size), static_cast<long long>(m.padded_vocab_size),
      static_cast<long long>(m.max_seq_len));
  const std::string cp =
      e.cp > 1 ? " x cp " + std::to_string(e.cp) + " (" + c.context_parallel_algorithm + ", " +
                     std::to_string(e.seq_len / e.cp) + " tokens of each sample per rank)"
               : "";
  std::printf(
      "layout: %d rank%s = dp %d x pp %d x tp %d%s, %d per node; micro-batch %lld x %lld "
      "tokens, %lld per step; %s on %s\n",
      c.world_size, c.world_size == 1 ? "" : "s", e.dp, e.pp, e.tp, cp.c_str(), e.ranks_per_node,
      static_cast<long long>(e.micro_batch), static_cast<long long>(e.seq_len),
      static_cast<long long>(e.grad_accum), std::string(DTypeName(e.compute_dtype)).c_str(),
      e.gpu ? "GPUs" : "the CPU backend");
  std::printf("this config: ZeRO stage %d, %s, activation checkpointing %s%s\n", e.zero_stage,
              OffloadName(c).c_str(),
              e.checkpointed == 0 ? "off" : (std::to_string(e.checkpointed) + " blocks").c_str(),
              e.pp > 1
                  ? (", pipeline stage " + std::to_string(e.pp_stage) + " (the largest)").c_str()
                  : "");
}

void PrintEstimateRank(const MemoryEstimate& e) {
  const char* where = e.gpu ? "GPU" : "memory";
  std::printf(
      "\nper rank, peak by category (as the MemoryTracker counts; the total is the peak "
      "of the sum):\n");
  std::printf("  %-16s %12s %12s\n", "category", where, e.gpu ? "host" : "");
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    const auto cat = static_cast<MemoryCategory>(c);
    std::printf("  %-16s %12s %12s\n", std::string(MemoryCategoryName(cat)).c_str(),
                FormatBytes(e.DevicePeak(cat)).c_str(),
                e.gpu ? FormatBytes(e.HostPeak(cat)).c_str() : "");
  }
  std::printf("  %-16s %12s %12s\n", "total", FormatBytes(e.device_total_peak).c_str(),
              e.gpu ? FormatBytes(e.host_total_peak).c_str() : "");
  const int64_t k = e.ranks_per_node;
  std::printf(
      "host memory: %s per rank, %s per node (%lld ranks); pinned %s per rank, %s per "
      "node\n",
      FormatBytes(e.gpu ? e.host_total_peak : e.device_total_peak).c_str(),
      FormatBytes(k * (e.gpu ? e.host_total_peak : e.device_total_peak)).c_str(),
      static_cast<long long>(k), FormatBytes(e.pinned_host_peak).c_str(),
      FormatBytes(k * e.pinned_host_peak).c_str());
  std::printf("NVMe: %s per rank, %s per node\n", FormatBytes(e.nvme_bytes).c_str(),
              FormatBytes(k * e.nvme_bytes).c_str());
}

void PrintEstimateTable(const std::vector<EstimateRow>& rows, bool gpu) {
  std::printf(
      "\nevery ZeRO stage and offload choice for this model, batch and world (per rank; "
      "\"ckpt\": every block checkpointed; host and NVMe per node):\n");
  const char* w = gpu ? "GPU" : "mem";
  std::printf("  %-5s %-19s %11s %11s %11s %11s %11s %11s %11s %11s\n", "stage", "offload",
              "parameters", "gradients", "optimizer", "activations",
              (std::string(w) + " peak").c_str(), (std::string(w) + " ckpt").c_str(), "host/node",
              "NVMe/node");
  for (const EstimateRow& r : rows) {
    const MemoryEstimate& e = r.plain;
    const int64_t host = e.gpu ? e.host_total_peak : 0;
    std::printf("  %-5d %-19s %11s %11s %11s %11s %11s %11s %11s %11s\n", r.stage,
                r.offload.c_str(), FormatBytes(e.DevicePeak(MemoryCategory::kParameters)).c_str(),
                FormatBytes(e.DevicePeak(MemoryCategory::kGradients)).c_str(),
                FormatBytes(e.DevicePeak(MemoryCategory::kOptimizerState)).c_str(),
                FormatBytes(e.DevicePeak(MemoryCategory::kActivations)).c_str(),
                FormatBytes(e.device_total_peak).c_str(),
                FormatBytes(r.checkpointed.device_total_peak).c_str(),
                FormatBytes(e.ranks_per_node * host).c_str(),
                FormatBytes(e.ranks_per_node * e.nvme_bytes).c_str());
  }
}

// Note [Nodes needed]
// `ztrain estimate --gpu-memory M --gpus-per-node G`: for each row of the table, the fewest
// nodes n (n * G ranks, the same micro-batch per GPU and gradient accumulation, so the global
// batch grows with n) whose per-GPU peak fits in M, with every block's activations kept and
// with every block checkpointed. ZeRO shards shrink as the ranks grow and nothing else grows
// with them, so a row's peak never rises with n and a binary search over n finds the fewest;
// node counts whose ranks the pipeline x tensor grid cannot divide are skipped, and a world
// the config refuses counts as not fitting.
struct NodesNeeded {
  int plain = 0, checkpointed = 0;  // 0: not within max_nodes
  int64_t plain_peak = 0, checkpointed_peak = 0;
};

std::vector<NodesNeeded> FindNodesNeeded(const EstimateArgs& args, const Config& config,
                                         const EstimateOptions& options, int64_t memory) {
  const int grid = config.pipeline_stages * config.tensor_parallel_size;
  const int step = grid / std::gcd(grid, args.gpus_per_node);  // nodes come in multiples of it
  std::map<int, std::vector<EstimateRow>> tables;
  auto table = [&](int nodes) -> const std::vector<EstimateRow>* {
    auto it = tables.find(nodes);
    if (it == tables.end()) {
      EstimateArgs a = args;
      a.world_size = nodes * args.gpus_per_node;
      a.micro_batch = config.train_micro_batch_size_per_gpu;
      std::vector<EstimateRow> rows;
      try {
        rows = EstimateTable(EstimateConfig(a), options);
      } catch (const ConfigError&) {
      }
      it = tables.emplace(nodes, std::move(rows)).first;
    }
    return it->second.empty() ? nullptr : &it->second;
  };
  const size_t count = EstimateTable(config, options).size();
  std::vector<NodesNeeded> needed(count);
  for (size_t r = 0; r < count; ++r) {
    for (const bool ckpt : {false, true}) {
      auto peak = [&](int nodes) -> int64_t {
        const std::vector<EstimateRow>* rows = table(nodes);
        if (rows == nullptr) return -1;
        const EstimateRow& row = (*rows)[r];
        return (ckpt ? row.checkpointed : row.plain).device_total_peak;
      };
      auto fits = [&](int nodes) {
        const int64_t p = peak(nodes);
        return p >= 0 && p <= memory;
      };
      int lo = 1, hi = args.max_nodes / step;  // in units of `step` nodes
      if (hi < 1 || !fits(hi * step)) continue;
      while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (fits(mid * step)) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      (ckpt ? needed[r].checkpointed : needed[r].plain) = lo * step;
      (ckpt ? needed[r].checkpointed_peak : needed[r].plain_peak) = peak(lo * step);
    }
  }
  return needed;
}

void PrintNodesNeeded(const EstimateArgs& args, const Config& config,
                      const EstimateOptions& options) {
  const int64_t memory = ParseBytes(args.gpu_memory, "--gpu-memory");
  const std::vector<EstimateRow> rows = EstimateTable(config, options);
  const std::vector<NodesNeeded> needed = FindNodesNeeded(args, config, options, memory);
  std::printf(
      "\nnodes of %d GPUs with %s each that every choice needs (micro-batch %lld per GPU, "
      "gradient accumulation %lld; GPU peak there; Note [Nodes needed]):\n",
      args.gpus_per_node, FormatBytes(memory).c_str(),
      static_cast<long long>(config.train_micro_batch_size_per_gpu),
      static_cast<long long>(config.gradient_accumulation_steps));
  std::printf("  %-5s %-19s %24s %24s\n", "stage", "offload", "nodes", "nodes, ckpt");
  auto cell = [&](int nodes, int64_t peak) {
    if (nodes == 0) return "over " + std::to_string(args.max_nodes);
    return std::to_string(nodes) + " (" + FormatBytes(peak) + ")";
  };
  for (size_t r = 0; r < rows.size(); ++r) {
    std::printf("  %-5d %-19s %24s %24s\n", rows[r].stage, rows[r].offload.c_str(),
                cell(needed[r].plain, needed[r].plain_peak).c_str(),
                cell(needed[r].checkpointed, needed[r].checkpointed_peak).c_str());
  }
}

// Note [Context-parallel plan]
// `ztrain estimate --seq-len T`: the config at T tokens per sample under every
// context_parallel.size c that divides the ranks left by pp x tp (dp = world / (pp tp c)) and
// both algorithms, each estimated as configured and with every block checkpointed (the
// shape-only engine runs the context-parallel code, so each figure is exact). A size and
// algorithm the config refuses (heads or T that do not divide) are listed with the reason.
// With --gpu-memory M the plan is the smallest c whose peak fits in M as configured (Ulysses
// when both fit: two all-to-alls a layer against P - 1 ring steps; ring when Ulysses is
// refused or does not fit), else the same with every block checkpointed: a larger c only adds
// traffic and leaves fewer data-parallel replicas.
void PrintContextPlan(const EstimateArgs& args, const Config& config,
                      const EstimateOptions& options) {
  const int64_t memory = args.gpu_memory.empty() ? 0 : ParseBytes(args.gpu_memory, "--gpu-memory");
  const int model_parallel = config.pipeline_stages * config.tensor_parallel_size;
  const int free_ranks = config.world_size / model_parallel;
  std::printf(
      "\ncontext parallelism for %lld tokens per sample on %d ranks (pp %d x tp %d; "
      "Note [Context-parallel plan]%s):\n",
      static_cast<long long>(config.data.seq_len), config.world_size, config.pipeline_stages,
      config.tensor_parallel_size,
      options.gpu.value_or(true) ? "; on GPUs context parallelism is not run yet, so these are "
                                   "what it would take"
                                 : "");
  std::printf("  %-4s %-9s %-4s %12s %12s %12s %12s%s\n", "cp", "algorithm", "dp", "tokens/rank",
              "activations", "peak", "peak, ckpt", memory > 0 ? "  fits" : "");
  EstimateOptions all = options;
  all.checkpointed_blocks = std::vector<int>(static_cast<size_t>(config.model.n_layer));
  std::iota(all.checkpointed_blocks->begin(), all.checkpointed_blocks->end(), 0);
  struct Fit {
    int cp = 0;
    std::string algorithm;
    bool checkpointed = false;
    int64_t peak = 0;
  };
  std::optional<Fit> plain_fit, ckpt_fit;
  for (int cp = 1; cp <= free_ranks; ++cp) {
    if (free_ranks % cp != 0) continue;
    for (const std::string algorithm : {"ulysses", "ring"}) {
      if (cp == 1 && algorithm == "ring") continue;  // one rank: no exchange at all
      nlohmann::json j = config.resolved;
      j["context_parallel"] = {{"size", cp}, {"algorithm", algorithm}};
      j.erase("train_batch_size");  // resolved again for this cp's dp
      Config c;
      try {
        c = ParseConfig(j, config.world_size);
      } catch (const ConfigError& e) {
        // The problems, one per line after the header, on one line.
        std::string why;
        const std::string text = e.what();
        for (size_t at = text.find("\n  "); at != std::string::npos;
             at = text.find("\n  ", at + 3)) {
          const size_t line_end = text.find('\n', at + 3);
          why += (why.empty() ? "" : "; ") + text.substr(at + 3, line_end - at - 3);
        }
        std::printf("  %-4d %-9s refused: %s\n", cp, cp == 1 ? "-" : algorithm.c_str(),
                    why.empty() ? text.c_str() : why.c_str());
        continue;
      }
      const MemoryEstimate as_is = EstimateMemory(c, options), ckpt = EstimateMemory(c, all);
      const auto peak = [&](const MemoryEstimate& e) {
        return e.gpu ? e.device_total_peak : e.total_peak;
      };
      std::string fits;
      if (memory > 0) {
        fits = peak(as_is) <= memory ? "  yes" : peak(ckpt) <= memory ? "  with ckpt" : "  no";
        if (peak(as_is) <= memory && !plain_fit) plain_fit = Fit{cp, algorithm, false, peak(as_is)};
        if (peak(ckpt) <= memory && !ckpt_fit) ckpt_fit = Fit{cp, algorithm, true, peak(ckpt)};
      }
      const MemoryCategory act = MemoryCategory::kActivations;
      std::printf("  %-4d %-9s %-4d %12lld %12s %12s %12s%s\n", cp,
                  cp == 1 ? "-" : algorithm.c_str(), c.dp_size,
                  static_cast<long long>(c.data.seq_len / cp),
                  FormatBytes(as_is.gpu ? as_is.device_peak[static_cast<int>(act)]
                                        : as_is.peak[static_cast<int>(act)])
                      .c_str(),
                  FormatBytes(peak(as_is)).c_str(), FormatBytes(peak(ckpt)).c_str(), fits.c_str());
    }
  }
  if (memory == 0) return;
  const std::optional<Fit>& best = plain_fit ? plain_fit : ckpt_fit;
  if (!best) {
    std::printf(
        "plan: no context_parallel size fits %s per rank at %lld tokens; add ranks, "
        "tensor or pipeline parallelism, offload, or a shorter --seq-len\n",
        FormatBytes(memory).c_str(), static_cast<long long>(config.data.seq_len));
    return;
  }
  std::printf(
      "plan: \"context_parallel\": {\"size\": %d, \"algorithm\": \"%s\"}%s: %s per rank of %s "
      "(the smallest size that fits)\n",
      best->cp, best->algorithm.c_str(),
      best->checkpointed ? " with every block checkpointed "
                           "(\"activation_checkpointing\": {\"enabled\": true})"
                         : "",
      FormatBytes(best->peak).c_str(), FormatBytes(memory).c_str());
  if (plain_fit && ckpt_fit && ckpt_fit->cp < plain_fit->cp) {
    std::printf(
        "  or size %d with every block checkpointed: %s per rank (about a third more "
        "compute for the recomputed forwards, no exchange over %d ranks)\n",
        ckpt_fit->cp, FormatBytes(ckpt_fit->peak).c_str(), plain_fit->cp);
  }
}

}  // namespace

int RunEstimate(const EstimateArgs& args) {
  try {
    const Config config = EstimateConfig(args);
    EstimateOptions options;
    options.gpus_per_node = args.gpus_per_node;
    if (!args.device.empty()) options.gpu = args.device == "gpu";
    const MemoryEstimate e = EstimateMemory(config, options);
    PrintEstimateHeader(config, e);
    PrintEstimateRank(e);
    PrintEstimateTable(EstimateTable(config, options), e.gpu);
    if (!args.gpu_memory.empty()) PrintNodesNeeded(args, config, options);
    if (args.seq_len > 0) PrintContextPlan(args, config, options);
    std::printf(
        "\nnot counted: the CUDA context, library workspaces (cuBLAS, NCCL) and blocks "
        "the caching allocator keeps free%s; see docs/memory.md\n",
        !e.gpu && e.compute_dtype != DType::kF32
            ? ", and on the CPU the ops' fp32 scratch for 16-bit arguments (large for fp16)"
            : "");
    return kExitOk;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "ztrain estimate: %s\n", e.what());
    return kExitConfigError;
  }
}

namespace {

// `ztrain tune --gemm`: every GEMM shape of the config's step timed on each CPU backend, the
// backend the trainer's rule keeps for it (Note [GEMMs chosen by measurement]), and what that
// saves against SGEMM alone. It times afresh and leaves the trainer's cache as it is.
int RunTuneGemm(const Config& config) {
  const bool bf16 = kernels::CpuHasBf16();
  std::printf("GEMM shapes of one train step (micro-batch %lld x %lld tokens), GFLOP/s on %d "
              "threads, best of 5 (OpenBLAS %s kernel):\n",
              static_cast<long long>(config.train_micro_batch_size_per_gpu),
              static_cast<long long>(config.data.seq_len > 0 ? config.data.seq_len
                                                             : config.model.max_seq_len),
              omp_get_max_threads(), kernels::BlasCoreName().c_str());
  std::printf("  %-18s %-16s %-22s %5s %9s %12s %9s %12s\n", "linear", "pass", "m x n x k", "runs",
              "OpenBLAS", "oneDNN fp32", "chosen", bf16 ? "oneDNN bf16" : "");
  double sgemm_seconds = 0.0, chosen_seconds = 0.0;
  for (const StepGemm& g : StepGemmShapes(config)) {
    const kernels::GemmRates r =
        kernels::TimeGemm(g.shape, {.onednn_fp32 = true, .onednn_bf16 = bf16});
    const double flops = g.shape.flops() * static_cast<double>(g.count);
    const bool small = g.shape.flops() < kernels::kMeasuredFlops;
    const bool onednn =
        !small && kernels::FasterBackend(r.sgemm, r.onednn_fp32) == kernels::GemmBackend::kOneDnn;
    sgemm_seconds += flops / (r.sgemm * 1e9);
    chosen_seconds += flops / ((onednn ? r.onednn_fp32 : r.sgemm) * 1e9);
    const std::string shape = g.shape.ToString();
    std::printf("  %-18s %-16s %-22s %5lld %9.1f %12.1f %9s %12s\n", g.linear.c_str(),
                g.pass.c_str(), shape.c_str(), static_cast<long long>(g.count), r.sgemm,
                r.onednn_fp32, onednn ? "oneDNN" : (small ? "OpenBLAS*" : "OpenBLAS"),
                bf16 ? detail::StrCat(static_cast<int64_t>(r.onednn_bf16)).c_str() : "");
  }
  std::printf("the step's fp32 GEMMs: %.1f ms on OpenBLAS alone, %.1f ms as chosen (%.1f %% less)\n",
              sgemm_seconds * 1e3, chosen_seconds * 1e3,
              100.0 * (1.0 - chosen_seconds / sgemm_seconds));
  const std::string cache = kernels::GemmCachePath();
  std::printf(
      "chosen: oneDNN where its fp32 matmul is at least %.0f %% faster than SGEMM, else "
      "OpenBLAS (*: under %g GFLOP, not measured by a train run). A train run measures "
      "once per machine and caches the choice%s; ZTRAIN_FP32_GEMM=openblas|onednn "
      "overrides it.\n",
      100.0 * (kernels::kOneDnnPays - 1.0), kernels::kMeasuredFlops / 1e9,
      cache.empty() ? "" : (" in " + cache).c_str());
  return kExitOk;
}

}  // namespace

int RunTune(const std::string& config_path, const std::string& memory_budget, int world_size,
            int64_t max_micro_batch, bool gemm) {
  try {
    if (gemm) {
      LaunchEnv env = DetectLaunchEnv();
      if (env.launcher == "none") env.world_size = world_size;
      return RunTuneGemm(LoadTrainConfig(config_path, env));
    }
    ZTRAIN_CHECK_T(ConfigError, !memory_budget.empty(),
                   "--memory-budget is required (e.g. 16GiB), or --gemm to time the "
                   "config's GEMM shapes");
    const int64_t budget = ParseBytes(memory_budget, "--memory-budget");
    LaunchEnv env = DetectLaunchEnv();
    if (env.launcher == "none") env.world_size = world_size;
    const Config config = LoadTrainConfig(config_path, env);
    const bool confirm = config.world_size == 1;
    const TuneResult r = TuneMicroBatch(config, budget, max_micro_batch, confirm);
    std::printf("budget %s per rank; micro-batch sizes tried (estimated peak):\n",
                FormatBytes(budget).c_str());
    for (const auto& [b, peak] : r.tried) {
      if (peak < 0) {
        std::printf("  %6lld  past the size limits (Note [Size limits])\n",
                    static_cast<long long>(b));
      } else {
        std::printf("  %6lld  %s%s\n", static_cast<long long>(b), FormatBytes(peak).c_str(),
                    peak <= budget ? "" : "  (over)");
      }
    }
    if (r.micro_batch == 0) {
      std::printf(
          "nothing fits: micro-batch 1 needs %s; raise the budget, use a higher ZeRO "
          "stage, offload or activation checkpointing (see ztrain estimate)\n",
          FormatBytes(r.tried.empty() ? 0 : r.tried.front().second).c_str());
      return kExitError;
    }
    std::printf("largest that fits: \"train_micro_batch_size_per_gpu\": %lld (estimated %s",
                static_cast<long long>(r.micro_batch), FormatBytes(r.estimated_peak).c_str());
    if (r.confirmed) {
      std::printf(", measured %s in one real step)\n", FormatBytes(r.measured_peak).c_str());
    } else {
      std::printf("; not confirmed by a real step: %s)\n", r.unconfirmed.c_str());
    }
    return kExitOk;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "ztrain tune: %s\n", e.what());
    return kExitConfigError;
  }
}

int RunTrain(const std::string& config_path, const std::string& resume) {
  const LaunchEnv env = DetectLaunchEnv();
  // Every rank reads the config before MPI starts: a bad config fails every rank the same
  // way, with nothing to wait for.
  Config config = LoadTrainConfig(config_path, env);
  if (env.world_size == 1) {
    SetThreadsPerRank(env);
    return Train(std::move(config), nullptr, env, resume);
  }
  if (env.launcher == "slurm" && env.rank == 0) {
    const std::string problem = SrunMpiProblem(std::getenv("SLURM_MPI_TYPE"), std::getenv("PMIX_RANK"));
    if (!problem.empty()) std::fprintf(stderr, "%s\n", problem.c_str());
  }
  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.training.comm_timeout_s * 1000.0));
  // Any failure ends the job, so the workers stop at the first one, before unwinding frees
  // buffers that MPI may still touch (Note [Stopping the workers]).
  std::unique_ptr<comm::Communicator> world =
      comm::MakeMpiWorld(timeout, nullptr, comm::OnCommFailure::kStopProcess);
  // Every rank's lines say which rank and host wrote them (a job's ranks share one log).
  const std::string where =
      "rank " + std::to_string(world->rank()) + (env.host.empty() ? "" : " on " + env.host);
  SetLogRankPrefix("[" + where + "] ");
  if (world->rank() != 0) SetLogLevel("warn");  // progress comes from rank 0, as DeepSpeed
  SetThreadsPerRank(env);
  try {
    ZTRAIN_CHECK(world->size() == env.world_size, "the launcher says ", env.world_size, " ranks (",
                 env.launcher, ") but MPI has ", world->size());
    return Train(std::move(config), world.get(), env, resume);
  } catch (const std::exception& e) {
    // One failing rank ends the whole job, so no other rank waits in a collective forever.
    std::fprintf(stderr, "ztrain: rank %d of %d on %s failed: %s\n", world->rank(),
                 world->size(), env.host.empty() ? "?" : env.host.c_str(), e.what());
    std::fflush(stderr);
    comm::AbortWorld(dynamic_cast<const ConfigError*>(&e) ? kExitConfigError : kExitError);
  }
}

int RunExport(const std::string& checkpoint, const std::string& format, const std::string& out,
              const std::string& dtype, const std::string& max_shard_size, bool merge,
              bool overwrite) {
  const DType type = dtype == "bf16" ? DType::kBF16 : dtype == "fp16" ? DType::kF16 : DType::kF32;
  const ExportResult r =
      ExportCheckpoint(checkpoint, format, out, type,
                       ParseBytes(max_shard_size, "--max-shard-size"), merge, overwrite);
  Log().info("exported {} (step {}, {} parameters) to {} ({}{}, {}, {} file{})", r.checkpoint,
             r.step, r.parameters, out, format, merge ? " merged" : "", dtype, r.files,
             r.files == 1 ? "" : "s");
  return kExitOk;
}

namespace {

// The resolved config as a config file a user can give again: the sizes "auto" derives are
// held as 0 inside (ModelConfig's accessors), which a config file may not say.
nlohmann::json AsConfigFile(nlohmann::json resolved) {
  for (const char* key : {"n_kv_head", "head_dim", "intermediate_size"}) {
    nlohmann::json& v = resolved["model"][key];
    if (v.is_number_integer() && v.get<int64_t>() == 0) v = "auto";
  }
  return resolved;
}

// What a run of `config` would resume from (`resume`: --resume's tag, or "" without it), on
// stderr; an explicit resume that has nothing to resume is refused, as train refuses it.
void CheckResume(const Config& config, const std::string& resume) {
  const std::string tag = !resume.empty() ? resume : config.checkpoint.resume ? "latest" : "";
  if (tag.empty()) return;
  const std::string& root = config.checkpoint.dir;
  ZTRAIN_CHECK_T(ConfigError, !root.empty(),
                 "--resume: checkpoint.dir is not set, so there is nothing to resume from; set "
                 "it to the directory the earlier run saved into");
  if (tag != "latest") {
    ZTRAIN_CHECK_T(ConfigError, fs::exists(fs::path(root) / tag / checkpoint::kMetaFile),
                   "--resume ", tag, ": checkpoint.dir '", root, "' holds no checkpoint ", tag,
                   "; give one it holds, or latest");
    std::fprintf(stderr, "resume: from %s/%s\n", root.c_str(), tag.c_str());
    return;
  }
  std::string problem;
  const std::vector<int64_t> steps = checkpoint::ResumeCandidates(root, &problem);
  if (!problem.empty()) std::fprintf(stderr, "resume: %s\n", problem.c_str());
  ZTRAIN_CHECK_T(ConfigError, !steps.empty() || resume.empty(), checkpoint::NothingToResume(root));
  if (steps.empty()) {
    std::fprintf(stderr,
                 "resume: checkpoint.dir '%s' holds no checkpoint yet: checkpoint.resume starts "
                 "this run from step 0 (--resume would refuse it)\n",
                 root.c_str());
  } else {
    std::fprintf(stderr, "resume: from %s/%s (the newest intact checkpoint)\n", root.c_str(),
                 checkpoint::StepName(steps[0]).c_str());
  }
}

}  // namespace

int RunCheckConfig(const std::string& config_path, int world_size, const std::string& resume) {
  try {
    LaunchEnv env = DetectLaunchEnv();
    if (env.launcher == "none") env.world_size = world_size;
    const Config config = LoadRunConfig(config_path, world_size, env);
    try {
      Preflight(config, PreflightOptions{.create_outputs = false, .open_data = true});
    } catch (const ConfigError& e) {
      throw ConfigError(detail::StrCat("config file ", config_path, ": ", e.what()));
    }
    std::printf("%s\n", AsConfigFile(config.resolved).dump(2).c_str());
    std::fflush(stdout);
    for (const AutoChoice& a : config.auto_choices) {
      std::fprintf(stderr, "auto: %s = %s (%s)\n", a.path.c_str(), a.value.dump().c_str(),
                   a.reason.c_str());
    }
    PrintDeviceChoice(config.device, world_size);
    CheckResume(config, resume);
    return kExitOk;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());  // names the file and every problem
    return kExitConfigError;
  }
}

void PrintVersion() {
  std::printf("ztrain %s\n", ZTRAIN_VERSION_STRING);
  std::printf("backends in this build:\n");
  std::printf("  CPU       yes (OpenBLAS %s, OpenMP)\n", ZTRAIN_BUILD_OPENBLAS);
  // Note [BLAS kernel]; run_tests.sh reads "best OPENBLAS_CORETYPE=".
  const kernels::IsaLevel cpu = kernels::CpuIsaLevel();
  const char* over = std::getenv(kernels::kChosenOverEnv);
  std::printf("  BLAS      %s kernel%s%s; this CPU: %s, best OPENBLAS_CORETYPE=%s\n",
              kernels::BlasCoreName().c_str(), over ? ", chosen by ztrain over " : "",
              over ? over : "", kernels::IsaLevelName(cpu), kernels::BestCoreType(cpu));
  if (kernels::cpu::OneDnnBuiltIn()) {
    const kernels::cpu::OneDnnSupport& bf16 = kernels::cpu::OneDnnBf16Support();
    const std::string cache = kernels::GemmCachePath();
    std::printf(
        "  oneDNN    yes (%s: the fp32 GEMM shapes it runs faster, measured once and "
        "cached in %s; bf16 matmuls%s)\n",
        bf16.available ? bf16.detail.c_str() : kernels::cpu::OneDnnVersion().c_str(),
        cache.empty() ? "nothing (no HOME)" : cache.c_str(),
        bf16.available ? "" : (" not: " + bf16.detail).c_str());
  } else {
    std::printf(
        "  oneDNN    no (fp32 and bf16 GEMMs on OpenBLAS; apt-get install libdnnl-dev, "
        "then reconfigure)\n");
  }
  if (ZTRAIN_BUILD_HAS_CUDA_TOOLKIT) {
    std::printf(
        "  CUDA      yes (cuBLAS and ztrain's kernels; CUDA devices visible now: %d; "
        "the config's \"device\" chooses)\n",
        kernels::CudaDeviceCount());
  } else {
    std::printf(
        "  CUDA      no (reconfigure with -DZTRAIN_WITH_CUDA=ON; needs the CUDA toolkit)\n");
  }
  if (ZTRAIN_BUILD_HAS_NCCL) {
    std::printf("  NCCL      yes (the ranks' collectives when they train on CUDA)\n");
  } else {
    std::printf("  NCCL      no (reconfigure with -DZTRAIN_WITH_NCCL=ON; needs CUDA and NCCL)\n");
  }
  std::printf("  MPI       %s\n", ZTRAIN_BUILD_HAS_MPI
                                      ? "yes (data parallel and ZeRO stages 0-3 under mpirun/srun)"
                                      : "no (reconfigure with -DZTRAIN_WITH_MPI=ON)");
  std::printf("  io_uring  %s\n",
              ZTRAIN_BUILD_HAS_IO_URING
                  ? "built (async file I/O for offload)"
                  : "no (offload file I/O uses pread/pwrite; install "
                    "liburing-dev and reconfigure with -DZTRAIN_WITH_IO_URING=ON)");
}

}  // namespace ztrain::launcher
