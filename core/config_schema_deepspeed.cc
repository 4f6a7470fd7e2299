// Schema table, part 1: DeepSpeed's batch, optimizer, scheduler, precision, ZeRO and aio
// keys, with DeepSpeed's names and defaults (deepspeed/runtime/constants.py, zero/config.py,
// zero/offload_config.py, swap_tensor/aio_config.py, ops/adam/fused_adam.py, lr_schedules.py).
#include "core/config_schema.h"

namespace ztrain::detail {
namespace {

using T = ConfigType;

const std::vector<std::string> kWarmup = {"WarmupLR", "WarmupDecayLR"};
const std::vector<std::string> kDecaying = {"WarmupDecayLR", "WarmupCosineLR"};
const std::vector<std::string> kAllSchedulers = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};

std::vector<ConfigKey> BatchAndTopLevelKeys() {
  return {
      Key("train_batch_size", T::kInt, nullptr,
          "Samples per optimizer step over all ranks = micro batch x gradient accumulation x "
          "data-parallel world size. Give any two of the three (or one, see the batch rules). "
          "`\"auto\"`: from the other two.")
          .Nullable()
          .Auto(),
      Key("train_micro_batch_size_per_gpu", T::kInt, nullptr,
          "Samples per forward/backward on one rank. `\"auto\"`: the largest that fits the "
          "device's memory by the estimate, as `ztrain tune` finds it (run/run_config.h).")
          .Nullable()
          .Auto(),
      Key("gradient_accumulation_steps", T::kInt, nullptr,
          "Micro-batches accumulated before each optimizer step. `\"auto\"`: 1 (the HF "
          "Trainer's default).")
          .Nullable()
          .Auto(),
      Key("steps_per_print", T::kInt, 10, "Log loss, lr and throughput every this many steps."),
      Key("gradient_clipping", T::kNumber, 0.0,
          "Clip the global gradient L2 norm to this value (0 = no clipping). `\"auto\"`: 1.0 "
          "(the HF Trainer's max_grad_norm).")
          .Auto(),
      Key("prescale_gradients", T::kBool, false,
          "Divide gradients by the world size before the all-reduce instead of after."),
      Key("gradient_predivide_factor", T::kNumber, 1.0,
          "Divide gradients by this before the all-reduce and by world_size/factor after."),
      Key("sparse_gradients", T::kBool, false, "CSR all-reduce of embedding gradients."),
      Key("wall_clock_breakdown", T::kBool, false,
          "Time forward, backward and step separately and log the breakdown."),
      Key("memory_breakdown", T::kBool, false, "Log the memory tracker's categories."),
      Key("dump_state", T::kBool, false, "Log the resolved config and engine state at start."),
      Key("disable_allgather", T::kBool, false, "Broadcast instead of all-gather (stage 1/2)."),
      Key("dataloader_drop_last", T::kBool, false, "Drop the last incomplete batch of an epoch."),
      Key("communication_data_type", T::kString, nullptr,
          "Data type of gradient all-reduce; null = the training dtype (fp32).")
          .Nullable()
          .Choices({"fp32", "fp16", "bf16", "bfp16"}),
      Key("seq_parallel_communication_data_type", T::kString, "fp32",
          "Data type of sequence-parallel communication.")
          .Choices({"fp32", "fp16", "bf16", "bfp16"}),
      Key("zero_allow_untested_optimizer", T::kBool, false,
          "Allow a client optimizer with ZeRO (ztrain has only its own optimizers)."),
      Key("zero_force_ds_cpu_optimizer", T::kBool, true,
          "Require DeepSpeed's CPU Adam with optimizer offload."),
  };
}

std::vector<ConfigKey> OptimizerKeys() {
  return {
      Key("optimizer", T::kSection, nullptr,
          "The optimizer. Without this section ztrain uses AdamW with the defaults below."),
      Key("optimizer.type", T::kString, "AdamW",
          "`Adam` or `AdamW`, matched case-insensitively as DeepSpeed does. `AdamW`, and `Adam` "
          "with `adam_w_mode` true, decay weights decoupled from the gradient (AdamW); `Adam` "
          "with `adam_w_mode` false adds `weight_decay * w` to the gradient (L2)."),
      Key("optimizer.legacy_fusion", T::kBool, false, "DeepSpeed fp16 legacy fusion; no effect."),
      Key("optimizer.params", T::kSection, nullptr, "Arguments of DeepSpeed's FusedAdam."),
      Key("optimizer.params.lr", T::kNumber, 1e-3,
          "Learning rate (`\"auto\"`: 5e-5, the HF Trainer's).")
          .Auto(),
      Key("optimizer.params.betas", T::kNumberPair, nlohmann::json::array({0.9, 0.999}),
          "[beta1, beta2], each in [0, 1) (`\"auto\"`: [0.9, 0.999], the HF Trainer's).")
          .Auto(),
      Key("optimizer.params.eps", T::kNumber, 1e-8, "Denominator epsilon, > 0 (`\"auto\"`: 1e-8).")
          .Auto(),
      Key("optimizer.params.weight_decay", T::kNumber, 0.0,
          "Weight decay of the groups that set none of their own (`optimizer.param_groups`: "
          "by default every parameter but biases and norm weights) (`\"auto\"`: 0, the HF "
          "Trainer's).")
          .Auto(),
      Key("optimizer.params.bias_correction", T::kBool, true, "Adam bias correction."),
      Key("optimizer.params.adam_w_mode", T::kBool, true,
          "With type `Adam`: true = decoupled decay (AdamW), false = L2. Must stay true with "
          "`AdamW`."),
      Key("optimizer.params.torch_adam", T::kBool, false,
          "Use torch's Adam instead of the fused kernel in DeepSpeed; same math in ztrain."),
      Key("optimizer.params.amsgrad", T::kBool, false, "AMSGrad variant."),
      Key("optimizer.params.max_grad_norm", T::kNumber, 0.0,
          "Legacy clipping argument; use top-level `gradient_clipping`."),
      Key("optimizer.param_groups", T::kParamGroups,
          nlohmann::json::array({{{"name", "no_decay"},
                                  {"params", nlohmann::json::array()},
                                  {"ndim", 1},
                                  {"weight_decay", 0.0},
                                  {"lr_scale", 1.0}}}),
          "ztrain: optimizer settings by group of parameters (torch's param groups, as rules). "
          "Each group is `{\"name\", \"params\": [globs over parameter names], \"ndim\": "
          "dimensions, \"weight_decay\", \"lr_scale\"}`; a parameter belongs to the first "
          "group whose globs (if given) match its name and whose `ndim` (if given) is its "
          "number of dimensions, else to the group `default`, which takes "
          "`optimizer.params`. `weight_decay` left out is `optimizer.params.weight_decay`; "
          "`lr_scale` (default 1) multiplies the scheduler's learning rate. The default keeps "
          "weight decay off every 1-dimensional parameter (biases and norm weights), as "
          "Megatron and the Hugging Face Trainer do; `[]` decays every trainable parameter. "
          "A glob that matches no parameter is an error. The run's log lists the groups "
          "(`parameter groups:`); docs/config.md, \"Parameter groups\"."),
  };
}

std::vector<ConfigKey> SchedulerKeys() {
  return {
      Key("scheduler", T::kSection, nullptr,
          "Learning-rate schedule. Without it the lr stays at `optimizer.params.lr`."),
      Key("scheduler.type", T::kString, nullptr,
          "`WarmupLR`, `WarmupDecayLR` or `WarmupCosineLR` (exact spelling, as DeepSpeed).")
          .Nullable(),
      Key("scheduler.params", T::kSection, nullptr,
          "Arguments of the schedule; which keys exist depends on `type`."),
      Key("scheduler.params.warmup_min_lr", T::kNumber, 0.0,
          "LR at step 0 (WarmupLR, WarmupDecayLR; `\"auto\"`: 0).")
          .Auto()
          .OnlyFor(kWarmup),
      Key("scheduler.params.warmup_max_lr", T::kNumber, 0.001,
          "LR reached after warmup; replaces `optimizer.params.lr` (`\"auto\"`: that lr).")
          .Auto()
          .OnlyFor(kWarmup),
      Key("scheduler.params.warmup_num_steps", T::kInt, 1000,
          "Warmup steps, >= 0 (`\"auto\"`: 0, the HF Trainer's warmup_steps). DeepSpeed uses "
          "at least 2.")
          .Auto()
          .OnlyFor(kAllSchedulers),
      Key("scheduler.params.warmup_type", T::kString, "log", "Warmup curve: `log` or `linear`.")
          .Choices({"log", "linear"})
          .OnlyFor(kAllSchedulers),
      Key("scheduler.params.total_num_steps", T::kInt, nullptr,
          "Required by WarmupDecayLR and WarmupCosineLR: step at which the decay ends "
          "(`\"auto\"`: `training.steps`).")
          .Nullable()
          .Auto()
          .OnlyFor(kDecaying),
      Key("scheduler.params.warmup_min_ratio", T::kNumber, 0.0,
          "WarmupCosineLR: LR at step 0 as a fraction of `optimizer.params.lr`.")
          .OnlyFor({"WarmupCosineLR"}),
      Key("scheduler.params.cos_min_ratio", T::kNumber, 0.0001,
          "WarmupCosineLR: final LR as a fraction of `optimizer.params.lr`.")
          .OnlyFor({"WarmupCosineLR"}),
      Key("scheduler.params.last_batch_iteration", T::kInt, -1,
          "Step the schedule resumes from (-1 = start).")
          .OnlyFor(kAllSchedulers),
  };
}

// See Note [Mixed precision config] (config_resolve.cc) for how they combine.
std::vector<ConfigKey> PrecisionKeys() {
  return {
      Key("fp16", T::kSection, nullptr,
          "fp16 mixed precision: the model computes in fp16 from fp32 master weights, with a "
          "loss scale that keeps small gradients from flushing to zero. An overflowing step is "
          "skipped. DeepSpeed's keys and defaults, plus `max_consecutive_skips`."),
      Key("fp16.enabled", T::kBool, false,
          "Train in fp16 (`\"auto\"`: false, the HF Trainer's default). Not together with "
          "`bf16.enabled`.")
          .Auto(),
      Key("fp16.auto_cast", T::kBool, false,
          "Cast inputs to fp16 (torch autocast). ztrain has no autocast: with `enabled` every "
          "op computes in fp16, so only false is accepted."),
      Key("fp16.loss_scale", T::kNumber, 0,
          "Static loss scale, >= 0; 0 = dynamic (the keys below). A static scale never "
          "changes, but an overflowing step is still skipped."),
      Key("fp16.initial_scale_power", T::kInt, 16,
          "The dynamic scale starts at 2^this, in [0, 1023]."),
      Key("fp16.loss_scale_window", T::kInt, 1000,
          "The dynamic scale doubles after this many steps without overflow, >= 1."),
      Key("fp16.hysteresis", T::kInt, 2,
          "Overflows tolerated before the dynamic scale halves, >= 1 (1 = halve on every "
          "overflow)."),
      Key("fp16.consecutive_hysteresis", T::kBool, false,
          "Refill `hysteresis` after every step without overflow (else only when the scale "
          "doubles)."),
      Key("fp16.min_loss_scale", T::kNumber, 1,
          "Lower bound of the dynamic scale, > 0. At the bound an overflow still skips the "
          "step (DeepSpeed raises instead; ztrain counts the skip, see `max_consecutive_skips`)."),
      Key("fp16.max_consecutive_skips", T::kInt, 50,
          "ztrain: the run stops with an error after this many overflowing (skipped) steps in "
          "a row, >= 0; 0 = no limit. 50 is well above the descent of a healthy start (17 "
          "overflows take 2^16 to 1 with hysteresis 2)."),
      Key("fp16.fp16_master_weights_and_grads", T::kBool, false,
          "Keep master weights and gradients in fp16 (ZeRO-2 + CPU offload only)."),
      Key("bf16", T::kSection, nullptr,
          "bf16 mixed precision: the model computes in bf16 from fp32 master weights; bf16 has "
          "fp32's range, so there is no loss scaling. Also read under DeepSpeed's older name "
          "`bfloat16` when `bf16` is absent."),
      Key("bf16.enabled", T::kBool, false,
          "Train in bf16 (`\"auto\"`: true where the hardware computes bf16 fast -- a GPU of "
          "compute capability 8.0 or later; a CPU where oneDNN's bf16 matmul measures at least "
          "1.1x the fp32 GEMM an fp32 run would use on the model's MLP GEMM -- or, on a CPU, "
          "where the fp32 run's estimated peak does not fit 90 % of the rank's memory and the "
          "bf16 run's does; and fp16 is not enabled; else false. The log says which and why). "
          "Not together with `fp16.enabled`.")
          .Auto(),
      Key("bf16.immediate_grad_update", T::kBool, true,
          "Accumulate gradients into fp32 right after each backward."),
      Key("bf16.check_overflow", T::kBool, false, "Check bf16 gradients for inf/nan."),
      Key("bf16.check_grad_overflow", T::kBool, false,
          "Newer DeepSpeed name of `check_overflow`."),
      Key("bf16.bf16_master_weights_and_grads", T::kBool, false,
          "Keep master weights and gradients in bf16 (ZeRO)."),
      Key("bf16.bf16_optimizer_states", T::kBool, false,
          "Keep optimizer states in bf16 (with `bf16_master_weights_and_grads`)."),
      Key("amp", T::kFreeObject, nlohmann::json{{"enabled", false}},
          "NVIDIA Apex AMP: `enabled` plus arguments passed to `amp.initialize`."),
  };
}

std::vector<ConfigKey> ZeroKeys() {
  const std::string z = "zero_optimization.";
  return {
      Key("zero_optimization", T::kSection, nullptr, "ZeRO sharding of model states."),
      Key(z + "stage", T::kInt, 0,
          "0 = data parallel, 1 = shard optimizer states, 2 = + gradients, 3 = + parameters."),
      Key(z + "allgather_partitions", T::kBool, true, "All-gather (not broadcast) parameters."),
      Key(z + "allgather_bucket_size", T::kInt, 500000000, "Elements per all-gather bucket."),
      Key(z + "overlap_comm", T::kBool, nullptr,
          "Overlap gradient reduction with backward; null = true at stage 3, else false.")
          .Nullable(),
      Key(z + "reduce_scatter", T::kBool, true, "Reduce-scatter (not all-reduce) gradients."),
      Key(z + "reduce_bucket_size", T::kInt, 500000000,
          "Elements per gradient bucket (`\"auto\"`: n_embd^2).")
          .Auto(),
      Key(z + "contiguous_gradients", T::kBool, true, "Copy gradients to a contiguous buffer."),
      Key(z + "use_multi_rank_bucket_allreduce", T::kBool, true,
          "Combine reduce buckets of all ranks into one all-reduce."),
      Key(z + "load_from_fp32_weights", T::kBool, true,
          "Initialise fp32 master weights from the fp32 copies in a checkpoint."),
      Key(z + "elastic_checkpoint", T::kBool, false, "Load checkpoints of other world sizes."),
      Key(z + "ignore_unused_parameters", T::kBool, true, "Allow parameters without gradient."),
      Key(z + "legacy_stage1", T::kBool, false, "DeepSpeed's old stage-1 implementation."),
      Key(z + "round_robin_gradients", T::kBool, false,
          "Parallelise gradient copies to CPU across ranks (stage 1/2 offload)."),
      Key(z + "sub_group_size", T::kInt, 1000000000, "Optimizer step tile size (elements)."),
      Key(z + "stage3_max_live_parameters", T::kInt, 1000000000,
          "Stage 3: most parameters resident per rank before releasing."),
      Key(z + "stage3_max_reuse_distance", T::kInt, 1000000000,
          "Stage 3: keep a parameter if it is reused within this many parameters."),
      Key(z + "stage3_prefetch_bucket_size", T::kInt, 50000000,
          "Stage 3: elements prefetched ahead of use (`\"auto\"`: 0.9 n_embd^2).")
          .Auto(),
      Key(z + "stage3_param_persistence_threshold", T::kInt, 100000,
          "Stage 3: parameters smaller than this stay unpartitioned (`\"auto\"`: 10 n_embd).")
          .Auto(),
      Key(z + "stage3_model_persistence_threshold", T::kInt, 9223372036854775807LL,
          "Stage 3: bound on all unpartitioned parameter elements."),
      Key(z + "stage3_gather_16bit_weights_on_model_save", T::kBool, false,
          "Stage 3: gather the full weights when saving the model."),
      Key(z + "zero_hpz_partition_size", T::kInt, 1, "ZeRO++ secondary partition size."),
      Key(z + "zero_quantized_weights", T::kBool, false, "ZeRO++ quantised weight all-gather."),
      Key(z + "zero_quantized_nontrainable_weights", T::kBool, false,
          "ZeRO++ quantised storage of frozen weights."),
      Key(z + "zero_quantized_gradients", T::kBool, false, "ZeRO++ quantised gradients."),
      Key(z + "mics_shard_size", T::kInt, -1, "MiCS shard group size (-1 = off)."),
      Key(z + "mics_hierarchical_params_gather", T::kBool, false, "MiCS hierarchical gather."),
      Key(z + "memory_efficient_linear", T::kBool, true, "Stage 3 memory-efficient linear."),
      Key(z + "pipeline_loading_checkpoint", T::kBool, false, "Stage 3 pipeline checkpoints."),
      Key(z + "override_module_apply", T::kBool, true, "Stage 3 nn.Module.apply override."),
      Key(z + "offload_param", T::kSection, nullptr, "Stage 3: where parameter shards live."),
      Key(z + "offload_param.device", T::kString, "none", "`none`, `cpu` or `nvme`.")
          .Choices({"none", "cpu", "nvme"}),
      Key(z + "offload_param.nvme_path", T::kString, nullptr, "Directory for NVMe swap files.")
          .Nullable(),
      Key(z + "offload_param.buffer_count", T::kInt, 5, "Pinned swap buffers."),
      Key(z + "offload_param.buffer_size", T::kInt, 100000000, "Elements per swap buffer."),
      Key(z + "offload_param.max_in_cpu", T::kInt, 1000000000,
          "Parameter elements kept in CPU memory with NVMe offload."),
      Key(z + "offload_param.pin_memory", T::kBool, false,
          "Use page-locked host memory; on a GPU the shards' copies then run beside compute."),
      Key(z + "offload_optimizer", T::kSection, nullptr,
          "Where optimizer states live and the optimizer runs."),
      Key(z + "offload_optimizer.device", T::kString, "none", "`none`, `cpu` or `nvme`.")
          .Choices({"none", "cpu", "nvme"}),
      Key(z + "offload_optimizer.nvme_path", T::kString, nullptr, "Directory for NVMe swap files.")
          .Nullable(),
      Key(z + "offload_optimizer.buffer_count", T::kInt, 4,
          "Pinned tile buffers (sub_group_size elements of m and v each); they also cache tiles "
          "between uses."),
      Key(z + "offload_optimizer.pin_memory", T::kBool, false, "Use page-locked host memory."),
      Key(z + "offload_optimizer.pipeline_read", T::kBool, false,
          "Read the next tile while stepping the current one."),
      Key(z + "offload_optimizer.pipeline_write", T::kBool, false,
          "Write the previous tile while stepping the current one."),
      Key(z + "offload_optimizer.fast_init", T::kBool, false, "Fast NVMe state init."),
      Key(z + "offload_optimizer.ratio", T::kNumber, 1.0,
          "Fraction of optimizer states offloaded (stage 3), in [0, 1]."),
  };
}

std::vector<ConfigKey> AioKeys() {
  return {
      Key("aio", T::kSection, nullptr,
          "Asynchronous file I/O for NVMe offload: io_uring, or a pread/pwrite thread pool "
          "where io_uring is unavailable."),
      Key("aio.block_size", T::kInt, 1048576,
          "Bytes per I/O piece: each swap read or write is cut into pieces of this size. A "
          "multiple of 4096 (O_DIRECT)."),
      Key("aio.queue_depth", T::kInt, 8, "Pieces in flight on the io_uring ring."),
      Key("aio.intra_op_parallelism", T::kInt, 1,
          "Threads of the pread/pwrite fallback pool (io_uring runs one ring on one thread)."),
      Key("aio.thread_count", T::kInt, 1,
          "Older name of intra_op_parallelism; used when intra_op_parallelism is not given."),
      Key("aio.single_submit", T::kBool, false,
          "io_uring: one submit call per piece instead of batches."),
      Key("aio.overlap_events", T::kBool, true,
          "io_uring: refill the ring as pieces complete; false waits for each batch of "
          "queue_depth pieces to finish."),
      Key("aio.use_gds", T::kBool, false, "GPUDirect Storage."),
  };
}

}  // namespace

std::vector<ConfigKey> DeepSpeedCoreKeys() {
  std::vector<ConfigKey> keys;
  for (auto part : {BatchAndTopLevelKeys(), OptimizerKeys(), SchedulerKeys(), PrecisionKeys(),
                    ZeroKeys(), AioKeys()}) {
    keys.insert(keys.end(), part.begin(), part.end());
  }
  return keys;
}

}  // namespace ztrain::detail
