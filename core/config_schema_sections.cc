// Schema table, part 2: DeepSpeed's activation checkpointing, monitoring, logging,
// checkpoint, pipeline and tensor-parallel sections, and the free-form feature sections.
#include "core/config_schema.h"

namespace ztrain::detail {
namespace {

using T = ConfigType;
using nlohmann::json;

// DeepSpeed leaves what to checkpoint to model code (deepspeed.checkpointing.checkpoint);
// ztrain's own `enabled` and `blocks` choose transformer blocks. See Note [Activation
// checkpointing config] (config_resolve.cc).
std::vector<ConfigKey> ActivationCheckpointingKeys() {
  const std::string a = "activation_checkpointing.";
  const std::string no_effect = " Accepted for DeepSpeed configs; no effect in ztrain: ";
  return {
      Key("activation_checkpointing", T::kSection, nullptr,
          "Recompute activations in backward instead of storing them: a checkpointed "
          "transformer block keeps only its input through the forward pass and runs its "
          "forward again in backward. DeepSpeed's keys, plus ztrain's `enabled` and `blocks`."),
      Key(a + "enabled", T::kBool, nullptr,
          "ztrain: checkpoint transformer blocks (which ones: `blocks`, else "
          "`number_checkpoints`, else all). null (absent): true when the section sets "
          "`number_checkpoints` or `blocks`, or `partition_activations` or "
          "`cpu_checkpointing` to true (DeepSpeed users set these when they checkpoint); "
          "else false.")
          .Nullable(),
      Key(a + "blocks", T::kIntList, nullptr,
          "ztrain: the indices of the blocks to checkpoint, each in [0, `model.n_layer`), "
          "no repeats; resolved sorted. null: the first `number_checkpoints` blocks, else "
          "every block. Resolved to the full list when checkpointing is enabled.")
          .Nullable(),
      Key(a + "partition_activations", T::kBool, false,
          "Shard checkpointed activations across tensor-parallel (model-parallel) ranks."),
      Key(a + "cpu_checkpointing", T::kBool, false, "Keep checkpointed activations on the CPU."),
      Key(a + "contiguous_memory_optimization", T::kBool, false,
          "Copy checkpoints into one contiguous buffer." + no_effect +
              "its allocators already keep freed blocks and hand them out again for the same "
              "sizes on the next step (CachingAllocator, CUDA memory pools), which is what the "
              "contiguous buffer buys DeepSpeed against fragmentation."),
      Key(a + "number_checkpoints", T::kInt, nullptr,
          "DeepSpeed: checkpoints in the contiguous buffer. ztrain: checkpoint the first N "
          "blocks, N in [1, `model.n_layer`]; with `blocks` as well, `blocks` must be exactly "
          "[0, N).")
          .Nullable(),
      Key(a + "synchronize_checkpoint_boundary", T::kBool, false,
          "Synchronise the device at each checkpoint boundary." + no_effect +
              "the recompute is enqueued on the one stream every op runs on (in order on the "
              "CPU), so no boundary needs a synchronisation; DeepSpeed uses it for timing and "
              "debugging."),
      Key(a + "profile", T::kBool, false,
          "Time the checkpointed forward and recompute." + no_effect +
              "`wall_clock_breakdown` times forward and backward, recompute included."),
  };
}

// tensorboard and csv_monitor share DeepSpeed's monitor fields.
std::vector<ConfigKey> MonitorKeys(const std::string& name, const std::string& what) {
  return {
      Key(name, T::kSection, nullptr, what),
      Key(name + ".enabled", T::kBool, false, "Turn the monitor on."),
      Key(name + ".output_path", T::kString, "",
          "Directory of the logs; empty = `training.output_dir`."),
      Key(name + ".job_name", T::kString, "DeepSpeedJobName", "Subdirectory / run name."),
  };
}

std::vector<ConfigKey> MonitoringKeys() {
  std::vector<ConfigKey> keys = {
      Key("flops_profiler", T::kSection, nullptr, "DeepSpeed's per-module FLOPs profiler."),
      Key("flops_profiler.enabled", T::kBool, false, "Profile one step."),
      Key("flops_profiler.recompute_fwd_factor", T::kNumber, 0.0,
          "Extra forward fraction recomputed by activation checkpointing."),
      Key("flops_profiler.profile_step", T::kInt, 1, "Step to profile."),
      Key("flops_profiler.module_depth", T::kInt, -1, "Depth of modules shown (-1 = all)."),
      Key("flops_profiler.top_modules", T::kInt, 1, "Top modules shown per depth."),
      Key("flops_profiler.detailed", T::kBool, true, "Show the per-module profile."),
      Key("flops_profiler.output_file", T::kString, nullptr, "File of the report; null = log.")
          .Nullable(),
      Key("wandb", T::kSection, nullptr, "Weights & Biases monitor."),
      Key("wandb.enabled", T::kBool, false, "Turn the monitor on."),
      Key("wandb.group", T::kString, nullptr, "Run group.").Nullable(),
      Key("wandb.team", T::kString, nullptr, "Team (entity).").Nullable(),
      Key("wandb.project", T::kString, "deepspeed", "Project."),
      Key("comet", T::kSection, nullptr, "Comet ML monitor."),
      Key("comet.enabled", T::kBool, false, "Turn the monitor on."),
      Key("comet.samples_log_interval", T::kInt, 100, "Log every this many samples."),
      Key("comet.project", T::kString, nullptr, "Project.").Nullable(),
      Key("comet.workspace", T::kString, nullptr, "Workspace.").Nullable(),
      Key("comet.api_key", T::kString, nullptr, "API key.").Nullable(),
      Key("comet.experiment_name", T::kString, nullptr, "Experiment name.").Nullable(),
      Key("comet.experiment_key", T::kString, nullptr, "Experiment key.").Nullable(),
      Key("comet.online", T::kBool, nullptr, "Log online.").Nullable(),
      Key("comet.mode", T::kString, nullptr, "Comet start mode.").Nullable(),
      Key("comms_logger", T::kSection, nullptr,
          "Log every collective with its size and time (ztrain counts bytes per op)."),
      Key("comms_logger.enabled", T::kBool, false, "Turn the logger on."),
      Key("comms_logger.verbose", T::kBool, false, "Log each op as it runs."),
      Key("comms_logger.prof_all", T::kBool, true, "Profile every op type."),
      Key("comms_logger.debug", T::kBool, false, "Name the caller of each op."),
      Key("comms_logger.prof_ops", T::kStringList, json::array(),
          "Op names profiled when `prof_all` is false."),
      Key("timers", T::kSection, nullptr, "Engine timers."),
      Key("timers.throughput", T::kSection, nullptr, "Samples/s timer."),
      Key("timers.throughput.enabled", T::kBool, true, "Measure throughput."),
      Key("timers.throughput.synchronized", T::kBool, true, "Synchronise the device first."),
  };
  for (auto part : {MonitorKeys("tensorboard", "TensorBoard monitor."),
                    MonitorKeys("csv_monitor", "CSV monitor: one file per metric.")}) {
    keys.insert(keys.end(), part.begin(), part.end());
  }
  return keys;
}

std::vector<ConfigKey> CheckpointAndParallelKeys() {
  return {
      Key("data_types", T::kSection, nullptr, "Data types of internal buffers."),
      Key("data_types.grad_accum_dtype", T::kString, nullptr,
          "Data type gradients are accumulated in. DeepSpeed's spellings are "
          "accepted (`float32`, `float`, `float16`, `half`, `bfloat16`, `torch.*`) and resolved "
          "to `fp32`, `fp16` or `bf16`. null: `fp16` when training in fp16 (DeepSpeed's fp16 "
          "optimizers keep fp16 gradients), else `fp32`, with bf16 too: a sum over many "
          "micro-batches keeps its precision (DeepSpeed defaults to bf16 there, fp32 in older "
          "releases without ZeRO; set `bf16` to match it). "
          "`fp16`/`bf16` need training in that same dtype; `fp32` always works.")
          .Nullable()
          .Choices({"fp32", "fp16", "bf16", "float32", "float", "torch.float32", "float16", "half",
                    "torch.float16", "bfloat16", "torch.bfloat16"}),
      Key("checkpoint", T::kSection, nullptr, "Checkpoint options."),
      Key("checkpoint.dir", T::kString, "",
          "ztrain: where checkpoints go (`<dir>/step<N>/`, `<dir>/latest`); empty = no "
          "checkpoints. With a dir, one is saved at the end and on SIGTERM/SIGUSR1."),
      Key("checkpoint.interval", T::kInt, 0,
          "ztrain: save a checkpoint every this many steps (0 = only at the end and on a "
          "signal)."),
      Key("checkpoint.keep_last", T::kInt, 3,
          "ztrain: how many checkpoints to keep; older ones are removed after a save."),
      Key("checkpoint.resume", T::kBool, false,
          "ztrain: resume from `<dir>/latest` (as `--resume`), falling back to the newest "
          "intact checkpoint. A job SLURM requeued (`SLURM_RESTART_COUNT` > 0) resumes so "
          "without it."),
      Key("checkpoint.slurm_requeue", T::kBool, true,
          "ztrain: in a SLURM batch job, SIGUSR1 (`sbatch --signal=USR1@120`, `scancel "
          "--signal=USR1`) saves a checkpoint and then requeues the job (`scontrol requeue`), "
          "which resumes from it; false: save and exit (status 130) only. SIGTERM never "
          "requeues (SLURM requeues preempted jobs by itself)."),
      Key("checkpoint.tag_validation", T::kString, "Warn",
          "Check that all ranks save the same tag: `Ignore`, `Warn` or `Fail`.")
          .Choices({"Ignore", "Warn", "Fail"}),
      Key("checkpoint.load_universal", T::kBool, false, "Load a DeepSpeed universal checkpoint."),
      Key("checkpoint.use_node_local_storage", T::kBool, false,
          "Each node writes to its own storage."),
      Key("checkpoint.parallel_write", T::kSection, nullptr, "Parallel checkpoint writes."),
      Key("checkpoint.parallel_write.pipeline_stage", T::kBool, false,
          "Pipeline stages write in parallel."),
      Key("pipeline", T::kSection, nullptr, "Pipeline parallelism."),
      Key("pipeline.stages", T::kInt, "auto", "Pipeline stages (`\"auto\"`: 1).").Auto(),
      Key("pipeline.partition", T::kString, "parameters",
          "ztrain: how layers are split into stages: `parameters` (balanced parameter counts) "
          "or `uniform` (balanced layer counts).")
          .Choices({"parameters", "uniform"}),
      Key("pipeline.schedule", T::kString, "1f1b",
          "ztrain: `1f1b` (at most stages - s micro-batches in flight on stage s) or `gpipe` "
          "(all forwards, then all backwards).")
          .Choices({"1f1b", "gpipe", "1F1B", "GPipe"}),
      Key("pipeline.seed_layers", T::kBool, false, "Seed each layer by its index."),
      Key("pipeline.activation_checkpoint_interval", T::kInt, 0,
          "Checkpoint every this many layers (0 = off)."),
      Key("pipeline.pipe_partitioned", T::kBool, true, "Shard activations sent between stages."),
      Key("pipeline.grad_partitioned", T::kBool, true, "Shard gradients sent between stages."),
      Key("tensor_parallel", T::kSection, nullptr, "Tensor (Megatron) parallelism."),
      Key("tensor_parallel.size", T::kInt, 1, "ztrain: tensor-parallel group size."),
      Key("tensor_parallel.sequence_parallel", T::kBool, false,
          "Megatron's sequence parallelism (`--sequence-parallel`): the norms and the residual "
          "stream between the tensor-parallel linears hold 1/size of the tokens on each rank, "
          "with an all-gather before each column-parallel linear and a reduce-scatter after "
          "each row-parallel one in place of the all-reduce (docs/long_context.md, \"Sequence "
          "parallelism\"). `data.seq_len` must divide by `size`."),
      Key("tensor_parallel.autotp_size", T::kInt, 0, "DeepSpeed AutoTP training size (0 = off)."),
      Key("tensor_parallel.tp", T::kSection, nullptr, "DeepSpeed TP settings."),
      Key("tensor_parallel.tp.tp_size", T::kInt, 1, "Tensor-parallel size."),
      Key("tensor_parallel.tp.tp_grain_size", T::kInt, 1, "Split granularity."),
      Key("tensor_parallel.keep_module_on_host", T::kBool, false,
          "Keep checkpoint weights on the host while loading."),
      Key("context_parallel", T::kSection, nullptr,
          "Context parallelism: each sequence split over ranks (Megatron's "
          "`--context-parallel-size`; docs/long_context.md, \"Context parallelism\")."),
      Key("context_parallel.size", T::kInt, 1,
          "Ranks each sequence is split over: each holds `data.seq_len / size` tokens of every "
          "sample through the whole model, attention exchanging what it needs; gradients are "
          "reduced over dp x size. `data.seq_len` and the query heads per tensor-parallel rank "
          "must divide by it."),
      Key("context_parallel.algorithm", T::kString, "ulysses",
          "`ulysses` (DeepSpeed-Ulysses, Megatron's `--cp-comm-type a2a`: an all-to-all turns "
          "sequence pieces into head groups around attention; the key/value heads per "
          "tensor-parallel rank divide `size` or are replicated) or `ring` (ring attention, "
          "Megatron's `p2p`: keys and values travel around the ranks while each attends its "
          "zigzag chunks, rank r holding chunks r and 2 size - 1 - r of 2 size; any head count, "
          "`data.seq_len` a multiple of 2 size).")
          .Choices({"ulysses", "ring"}),
  };
}

// Sections whose content DeepSpeed defines freely (or that only switch a feature on). They
// are accepted as objects without key checks and refused when they enable anything.
std::vector<ConfigKey> FreeFormKeys() {
  const json off = {{"enabled", false}};
  return {
      Key("elasticity", T::kFreeObject, off, "Elastic training over changing GPU counts."),
      Key("autotuning", T::kFreeObject, off, "DeepSpeed's autotuner."),
      Key("compression_training", T::kFreeObject, json::object(),
          "Quantisation, pruning and layer reduction during training."),
      Key("data_efficiency", T::kFreeObject, off, "Curriculum sampling and random-LTD."),
      Key("curriculum_learning", T::kFreeObject, off, "Legacy curriculum learning."),
      Key("progressive_layer_drop", T::kFreeObject, off, "Progressive layer dropping."),
      Key("eigenvalue", T::kFreeObject, off, "Hessian eigenvalue estimation (MoQ)."),
      Key("quantize_training", T::kFreeObject, off, "MoQ quantised training."),
      Key("hybrid_engine", T::kFreeObject, off, "RLHF hybrid train/inference engine."),
      Key("nebula", T::kFreeObject, off, "Azure Nebula checkpointing."),
      Key("compile", T::kFreeObject, off, "torch.compile / DeepCompile."),
      Key("torch_autocast", T::kFreeObject, off, "torch.autocast mixed precision."),
      Key("sparse_attention", T::kFreeObject, nullptr,
          "Block-sparse attention layouts (on when present).")
          .Nullable(),
      Key("weight_quantization", T::kFreeObject, nullptr,
          "Weight quantisation at load (on when present).")
          .Nullable(),
  };
}

}  // namespace

std::vector<ConfigKey> DeepSpeedOtherKeys() {
  std::vector<ConfigKey> keys;
  for (auto part : {ActivationCheckpointingKeys(), MonitoringKeys(), CheckpointAndParallelKeys(),
                    FreeFormKeys()}) {
    keys.insert(keys.end(), part.begin(), part.end());
  }
  return keys;
}

}  // namespace ztrain::detail
