// Pass 5 of ParseConfig: values of the right type that the trainer still cannot use. Each
// message says what the value must be and how to get there.
#include <algorithm>
#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/config_internal.h"
#include "core/config_schema.h"
#include "core/error.h"
#include "core/sizes.h"

namespace ztrain::detail {
namespace {

using nlohmann::json;

int64_t Int(const json& t, const std::string& path) { return At(t, path).get<int64_t>(); }
double Num(const json& t, const std::string& path) { return At(t, path).get<double>(); }

void IntAtLeast(const json& t, const std::string& path, int64_t min, ConfigErrors& errors) {
  const json& v = At(t, path);
  // Unsigned: >= 0, and may not fit int64_t (training.seed); only a positive minimum can fail.
  if (v.is_number_unsigned()) {
    if (min > 0 && v.get<uint64_t>() < static_cast<uint64_t>(min)) {
      errors.Add(path, StrCat("must be >= ", min, ", got ", v.get<uint64_t>()));
    }
    return;
  }
  if (v.is_number() && v.get<int64_t>() < min) {
    errors.Add(path, StrCat("must be >= ", min, ", got ", v.get<int64_t>()));
  }
}

void NumInRange(const json& t, const std::string& path, double lo, double hi,
                ConfigErrors& errors) {
  const double v = Num(t, path);
  if (!(v >= lo && v <= hi)) errors.Add(path, StrCat("must be in [", lo, ", ", hi, "], got ", v));
}

void NumAtLeast(const json& t, const std::string& path, double min, ConfigErrors& errors) {
  const double v = Num(t, path);
  if (!(v >= min)) errors.Add(path, StrCat("must be >= ", min, ", got ", v));
}

void CheckModel(const json& t, ConfigErrors& errors) {
  for (const char* key :
       {"model.n_layer", "model.n_head", "model.n_embd", "model.vocab_size", "model.max_seq_len"}) {
    IntAtLeast(t, key, 1, errors);
  }
  // 0 follows the other sizes ("auto").
  for (const char* key : {"model.n_kv_head", "model.head_dim", "model.intermediate_size"}) {
    IntAtLeast(t, key, 0, errors);
  }
  if (ClampedInt(At(t, "model.n_layer")) > kMaxLayers) {
    errors.Add("model.n_layer",
               StrCat("must be <= ", kMaxLayers, ", got ", ValueText(At(t, "model.n_layer"))));
  }
  const int64_t n_head = Int(t, "model.n_head"), n_embd = Int(t, "model.n_embd");
  if (n_head >= 1 && n_embd >= 1 && n_embd % n_head != 0) {
    const int64_t lower = n_embd - n_embd % n_head;
    errors.Add("model.n_embd",
               StrCat(n_embd, " is not divisible by model.n_head ", n_head,
                      "; use a multiple of n_head (e.g. ", lower > 0 ? lower : n_head, " or ",
                      lower + n_head, ") or a divisor of n_embd as n_head"));
  }
  const int64_t vocab = Int(t, "model.vocab_size"), padded = Int(t, "model.padded_vocab_size");
  if (padded < vocab) {
    errors.Add("model.padded_vocab_size",
               StrCat(padded, " is smaller than model.vocab_size ", vocab, "; use >= ", vocab,
                      " or \"auto\" (", (vocab + 127) / 128 * 128, ")"));
  }
  const int64_t seq = Int(t, "data.seq_len"), max_seq = Int(t, "model.max_seq_len");
  if (seq < 1 || seq > max_seq) {
    errors.Add("data.seq_len", StrCat(seq, " must be in [1, model.max_seq_len = ", max_seq,
                                      "]; lower it, or raise model.max_seq_len"));
  }
}

// Note [Packed documents]'s boundary tokens: -1 (the manifest's) or a token of the vocabulary,
// at most one of the two.
void CheckPackedDocuments(const json& t, ConfigErrors& errors) {
  const int64_t vocab = Int(t, "model.vocab_size");
  for (const char* key : {"data.document_start_token", "data.document_end_token"}) {
    const int64_t token = Int(t, key);
    if (token < -1 || token >= vocab) {
      errors.Add(key, StrCat(token, " is not a token of model.vocab_size ", vocab,
                             "; give a token id, or -1 to read it from the corpus manifest"));
    }
  }
  if (Int(t, "data.document_start_token") >= 0 && Int(t, "data.document_end_token") >= 0) {
    errors.Add("data.document_end_token",
               "is set beside data.document_start_token; give one of them (the start token when "
               "documents have both: each document then starts at it)");
  }
}

void CheckTraining(const json& t, ConfigErrors& errors) {
  IntAtLeast(t, "training.steps", 0, errors);
  const std::string job = At(t, "training.job_name");
  if (job.empty() || job == "." || job == ".." || job.find_first_of("/\\") != std::string::npos) {
    errors.Add("training.job_name", "must be a plain, non-empty file name (no '/'), got \"" + job +
                                        "\"; e.g. \"gpt2-zero3\"");
  }
  IntAtLeast(t, "training.seed", 0, errors);
  IntAtLeast(t, "training.eval_interval", 0, errors);
  IntAtLeast(t, "checkpoint.interval", 0, errors);
  IntAtLeast(t, "checkpoint.keep_last", 1, errors);
  NumAtLeast(t, "training.comm_timeout_s", 0.001, errors);
  IntAtLeast(t, "training.sample_interval", 0, errors);
  IntAtLeast(t, "training.sample_tokens", 1, errors);
  NumAtLeast(t, "training.sample_temperature", 0.0, errors);
  IntAtLeast(t, "training.eval_batches", Int(t, "training.eval_interval") > 0 ? 1 : 0, errors);
  IntAtLeast(t, "steps_per_print", 1, errors);
  NumAtLeast(t, "gradient_clipping", 0.0, errors);
  if (!(Num(t, "gradient_predivide_factor") > 0)) {
    errors.Add("gradient_predivide_factor", "must be > 0 (1.0 = divide after the all-reduce)");
  }
}

void CheckOptimizer(const json& t, ConfigErrors& errors) {
  const json& type = At(t, "optimizer.type");
  if (type != "Adam" && type != "AdamW") return;  // refused; its params are DeepSpeed's business
  NumAtLeast(t, "optimizer.params.lr", 0.0, errors);
  NumAtLeast(t, "optimizer.params.weight_decay", 0.0, errors);
  const json& betas = At(t, "optimizer.params.betas");
  for (const json& b : betas) {
    if (!(b.get<double>() >= 0.0 && b.get<double>() < 1.0)) {
      errors.Add("optimizer.params.betas",
                 "each beta must be in [0, 1), got " + betas.dump() + "; e.g. [0.9, 0.999]");
      break;
    }
  }
  if (!(Num(t, "optimizer.params.eps") > 0)) {
    errors.Add("optimizer.params.eps", "must be > 0 (DeepSpeed's default is 1e-8)");
  }
  if (type == "AdamW" && At(t, "optimizer.params.adam_w_mode") == false) {
    errors.Add("optimizer.params.adam_w_mode",
               "false has no effect with type AdamW (DeepSpeed always decouples its weight "
               "decay); for L2 decay use type \"Adam\" with adam_w_mode false");
  }
}

void CheckScheduler(const json& t, ConfigErrors& errors) {
  const json& type = At(t, "scheduler.type");
  const auto& supported = SupportedSchedulerTypes();
  if (!type.is_string() ||
      std::find(supported.begin(), supported.end(), type.get<std::string>()) == supported.end()) {
    return;  // no scheduler, or refused (its params are then DeepSpeed's business)
  }
  const std::string p = "scheduler.params.";
  IntAtLeast(t, p + "warmup_num_steps", 0, errors);  // DeepSpeed warms up over max(2, n)
  IntAtLeast(t, p + "last_batch_iteration", -1, errors);
  if (type == "WarmupLR" || type == "WarmupDecayLR") {
    NumAtLeast(t, p + "warmup_min_lr", 0.0, errors);
    NumAtLeast(t, p + "warmup_max_lr", 0.0, errors);
  }
  if (type == "WarmupCosineLR") {
    NumInRange(t, p + "warmup_min_ratio", 0.0, 1.0, errors);
    NumInRange(t, p + "cos_min_ratio", 0.0, 1.0, errors);
  }
  if (type == "WarmupDecayLR" || type == "WarmupCosineLR") {
    if (At(t, p + "total_num_steps").is_null()) {
      errors.Add(p + "total_num_steps",
                 StrCat("required by ", type.get<std::string>(),
                        "; set it to the step the decay ends (e.g. training.steps = ",
                        Int(t, "training.steps"), ") or \"auto\""));
    } else {
      IntAtLeast(t, p + "total_num_steps", 1, errors);
    }
  }
}

// Offload as DeepSpeed allows it: parameters at stage 3, optimizer state at stages 1-3, NVMe
// with a directory.
void CheckOffload(const json& t, int64_t stage, ConfigErrors& errors) {
  const std::string z = "zero_optimization.";
  const std::string param = At(t, z + "offload_param.device");
  const std::string optimizer = At(t, z + "offload_optimizer.device");
  if (param != "none" && stage != 3) {
    errors.Add(z + "offload_param.device",
               StrCat("parameter offload needs ZeRO stage 3 (parameters are sharded only "
                      "there), got stage ",
                      stage,
                      "; set zero_optimization.stage to 3 or use "
                      "offload_optimizer"));
  }
  if (optimizer != "none" && stage == 0) {
    errors.Add(z + "offload_optimizer.device",
               "optimizer offload needs ZeRO stage 1, 2 or 3 (the optimizer state is sharded "
               "there); set zero_optimization.stage to 1 or more");
  }
  for (const auto& [section, device] :
       {std::pair{"offload_param", param}, std::pair{"offload_optimizer", optimizer}}) {
    const json& path = At(t, z + section + ".nvme_path");
    if (device == "nvme" && (!path.is_string() || path.get<std::string>().empty())) {
      errors.Add(z + section + ".nvme_path",
                 "must name a directory for the swap files when device is \"nvme\", e.g. "
                 "\"/local_nvme\"");
    }
  }
  const int64_t needed = 1 + (At(t, z + "offload_optimizer.pipeline_read") == true ? 1 : 0) +
                         (At(t, z + "offload_optimizer.pipeline_write") == true ? 1 : 0);
  if (optimizer == "nvme" && Int(t, z + "offload_optimizer.buffer_count") < needed) {
    errors.Add(z + "offload_optimizer.buffer_count",
               StrCat("must be >= ", needed,
                      " (one buffer per tile being read, stepped or "
                      "written with pipeline_read/pipeline_write), got ",
                      Int(t, z + "offload_optimizer.buffer_count")));
  }
  if (param == "nvme" && Int(t, z + "offload_param.buffer_count") < 1) {
    errors.Add(z + "offload_param.buffer_count", "must be >= 1");
  }
}

// "cuda:N" past the GPUs of the machine is found at start (run/device_select.h): the
// config may be checked where it does not run.
void CheckDevice(const json& t, ConfigErrors& errors) {
  const json& device = At(t, "device");
  if (!ParseDeviceSetting(device.get<std::string>())) {
    errors.Add("device", StrCat("expected ", kDeviceSettings, ", got ", device.dump()));
  }
}

// What the offload I/O engine takes (kAio* in core/config.h): refused here, so that
// check-config names it, not the first swap of a run.
void CheckAio(const json& t, ConfigErrors& errors) {
  const int64_t block = ClampedInt(At(t, "aio.block_size"));
  if (block >= 1 && (block % kAioAlignment != 0 || block > kAioMaxBlockSize)) {
    errors.Add("aio.block_size", StrCat("must be a multiple of ", kAioAlignment,
                                        " bytes (O_DIRECT) up to 1 GiB, got ", block,
                                        "; DeepSpeed's default is 1048576"));
  }
  for (const auto& [key, most] : {std::pair{"aio.queue_depth", kAioMaxQueueDepth},
                                  std::pair{"aio.intra_op_parallelism", kAioMaxThreads},
                                  std::pair{"aio.thread_count", kAioMaxThreads}}) {
    if (ClampedInt(At(t, key)) > most) {
      errors.Add(key, StrCat("must be at most ", most, ", got ", ValueText(At(t, key))));
    }
  }
}

// Note [Sequence parallelism] (nn/linear_provider.h): the tokens split evenly over the tp
// ranks, and the parts not built with it yet.
void CheckSequenceParallel(const json& t, ConfigErrors& errors) {
  if (At(t, "tensor_parallel.sequence_parallel") != true) return;
  const int64_t tp = Int(t, "tensor_parallel.size"), seq = Int(t, "data.seq_len");
  if (tp >= 1 && seq >= 1 && seq % tp != 0) {
    errors.Add("tensor_parallel.sequence_parallel",
               StrCat("tensor_parallel.size ", tp, " does not divide data.seq_len ", seq,
                      " (each rank holds seq_len / size tokens of every sample); use a seq_len "
                      "that is a multiple of ",
                      tp));
  }
  if (At(t, "activation_checkpointing.partition_activations") == true) {
    errors.Add("activation_checkpointing.partition_activations",
               "with tensor_parallel.sequence_parallel: the checkpointed inputs are split over "
               "the tp ranks already; drop partition_activations");
  }
}

// Note [Context parallelism] (nn/context_parallel.h): every sample's tokens split evenly over
// the cp ranks, and under Ulysses each rank's query heads (of its tensor-parallel piece) a
// whole group, its key/value heads a group too or one head it shares.
void CheckContextParallel(const json& t, ConfigErrors& errors) {
  const int64_t cp = ClampedInt(At(t, "context_parallel.size"));
  if (cp <= 1) return;
  const int64_t tp = std::max<int64_t>(1, ClampedInt(At(t, "tensor_parallel.size")));
  const int64_t seq = ClampedInt(At(t, "data.seq_len"));
  const bool ring = At(t, "context_parallel.algorithm") == "ring";
  if (ring && seq >= 1 && seq % (2 * cp) != 0) {
    errors.Add(
        "context_parallel.size",
        StrCat("ring attention cuts data.seq_len ", seq,
               " into 2 x context_parallel.size = ", 2 * cp,
               " chunks, which do not divide it; use a seq_len that is a multiple of ", 2 * cp));
  } else if (seq >= 1 && seq % cp != 0) {
    errors.Add("context_parallel.size",
               StrCat("context_parallel.size ", cp, " does not divide data.seq_len ", seq,
                      "; use a seq_len that is a multiple of ", cp));
  } else if (seq >= 1 && At(t, "tensor_parallel.sequence_parallel") == true &&
             (seq / cp) % tp != 0) {
    errors.Add("tensor_parallel.sequence_parallel",
               StrCat("data.seq_len ", seq, " / context_parallel.size ", cp, " = ", seq / cp,
                      " tokens per rank do not divide over tensor_parallel.size ", tp,
                      "; use a seq_len that is a multiple of ", cp * tp));
  }
  const int64_t heads = ClampedInt(At(t, "model.n_head"));
  const int64_t kv_given = ClampedInt(At(t, "model.n_kv_head"));
  const int64_t kv = kv_given > 0 ? kv_given : heads;
  // Ring attention keeps every head; tp's own checks name heads it does not divide.
  if (ring || heads < 1 || heads % tp != 0 || kv < 1 || kv % tp != 0) return;
  if ((heads / tp) % cp != 0) {
    errors.Add("context_parallel.size",
               StrCat("context_parallel.size ", cp, " does not divide the ", heads / tp,
                      " query heads of each tensor-parallel rank (model.n_head ", heads,
                      " / tensor_parallel.size ", tp,
                      "): Ulysses gives each rank a group of whole heads; use a size that "
                      "divides ",
                      heads / tp, ", or \"algorithm\": \"ring\" (any head count)"));
  } else if ((kv / tp) % cp != 0 && cp % (kv / tp) != 0) {
    errors.Add("context_parallel.size",
               StrCat("context_parallel.size ", cp, " and the ", kv / tp,
                      " key/value heads of each tensor-parallel rank (model.n_kv_head ", kv,
                      " / tensor_parallel.size ", tp,
                      ") neither divide each other: Ulysses gives each rank a group of them or "
                      "one it shares; use a size that divides or is a multiple of ",
                      kv / tp, ", or \"algorithm\": \"ring\" (any head count)"));
  }
}

void CheckParallelAndIo(const json& t, ConfigErrors& errors) {
  const int64_t stage = Int(t, "zero_optimization.stage");
  if (stage < 0 || stage > 3) {
    errors.Add("zero_optimization.stage", StrCat("must be 0, 1, 2 or 3, got ", stage));
  }
  for (const ConfigKey& key : ConfigSchema::Get().keys()) {
    // DeepSpeed's pydantic models declare every ZeRO and offload size with ge=0.
    if (key.type == ConfigType::kInt && key.path.rfind("zero_optimization.", 0) == 0 &&
        key.path != "zero_optimization.mics_shard_size") {
      IntAtLeast(t, key.path, 0, errors);
    }
  }
  NumInRange(t, "zero_optimization.offload_optimizer.ratio", 0.0, 1.0, errors);
  CheckOffload(t, stage, errors);
  for (const char* key :
       {"aio.block_size", "aio.queue_depth", "aio.intra_op_parallelism", "aio.thread_count",
        "pipeline.stages", "tensor_parallel.size", "context_parallel.size",
        "tensor_parallel.tp.tp_size", "tensor_parallel.tp.tp_grain_size"}) {
    IntAtLeast(t, key, 1, errors);
  }
  CheckAio(t, errors);
  IntAtLeast(t, "tensor_parallel.autotp_size", 0, errors);
  IntAtLeast(t, "pipeline.activation_checkpoint_interval", 0, errors);
  CheckSequenceParallel(t, errors);
  CheckContextParallel(t, errors);
}

// Note [Mixed precision config] (config_resolve.cc). DeepSpeed's pydantic model checks the
// fp16 keys whether or not fp16 is enabled, and so do we.
void CheckPrecision(const json& t, ConfigErrors& errors) {
  const bool fp16 = At(t, "fp16.enabled") == true;
  const bool bf16 = At(t, "bf16.enabled") == true;
  if (fp16 && bf16) {
    errors.Add("fp16.enabled",
               "true together with bf16.enabled true; choose one: bf16 (fp32's range, no loss "
               "scaling) where the hardware has it, else fp16");
  }
  if (!(Num(t, "fp16.loss_scale") >= 0)) {
    errors.Add("fp16.loss_scale",
               StrCat("must be >= 0 (0 = dynamic loss scaling), got ", Num(t, "fp16.loss_scale")));
  }
  const int64_t power = ClampedInt(At(t, "fp16.initial_scale_power"));
  if (power < 0 || power > 1023) {
    errors.Add("fp16.initial_scale_power",
               StrCat("must be in [0, 1023] (the dynamic scale starts at 2^power; DeepSpeed's "
                      "default is 16), got ",
                      ValueText(At(t, "fp16.initial_scale_power"))));
  }
  IntAtLeast(t, "fp16.loss_scale_window", 1, errors);
  IntAtLeast(t, "fp16.hysteresis", 1, errors);
  if (ClampedInt(At(t, "fp16.hysteresis")) > INT32_MAX) {
    errors.Add("fp16.hysteresis", StrCat("must be <= ", INT32_MAX, " (usually 2)"));
  }
  if (!(Num(t, "fp16.min_loss_scale") > 0)) {
    errors.Add("fp16.min_loss_scale", StrCat("must be > 0 (DeepSpeed's default is 1), got ",
                                             Num(t, "fp16.min_loss_scale")));
  }
  IntAtLeast(t, "fp16.max_consecutive_skips", 0, errors);
  if (fp16 && bf16) return;  // the training dtype is unknown until one is chosen
  const std::string compute = fp16 ? "fp16" : bf16 ? "bf16" : "fp32";
  const std::string accum = At(t, "data_types.grad_accum_dtype");
  if (accum == "fp32" || accum == compute) return;
  if (compute == "fp32") {
    errors.Add("data_types.grad_accum_dtype", StrCat("\"", accum, "\" gradients need ", accum,
                                                     " training, but this config "
                                                     "trains in fp32; set ",
                                                     accum,
                                                     ".enabled to true, or grad_accum_dtype to "
                                                     "\"fp32\" or null"));
  } else {
    errors.Add("data_types.grad_accum_dtype",
               StrCat("\"", accum, "\" gradients do not go with ", compute, " training (", compute,
                      ".enabled); use \"", compute, "\" or \"fp32\", or null (",
                      compute == "fp16" ? "fp16" : "fp32", ")"));
  }
}

// Note [Activation checkpointing config] (config_resolve.cc): the blocks resolved there, or
// the values it left for us to name.
void CheckActivationCheckpointing(const json& t, ConfigErrors& errors) {
  const std::string a = "activation_checkpointing.";
  const int64_t layers = ClampedInt(At(t, "model.n_layer"));
  if (layers < 1 || layers > kMaxLayers) return;  // CheckModel names it
  const json& number = At(t, a + "number_checkpoints");
  const int64_t count = number.is_null() ? 0 : ClampedInt(number);
  const bool count_ok = count >= 1 && count <= layers;
  if (!number.is_null() && !count_ok) {
    errors.Add(a + "number_checkpoints", StrCat("must be in [1, model.n_layer = ", layers,
                                                "] (checkpoint the first N "
                                                "blocks) or null (every block), got ",
                                                ValueText(number)));
  }
  const json& blocks = At(t, a + "blocks");
  if (!blocks.is_array()) return;
  if (blocks.empty()) {
    errors.Add(a + "blocks",
               "lists no block; give the indices to checkpoint, null for every block, or set "
               "enabled to false");
    return;
  }
  bool blocks_ok = true;
  for (size_t i = 0; i < blocks.size(); ++i) {  // sorted by ResolveActivationCheckpointing
    const int64_t b = ClampedInt(blocks[i]);
    if (b < 0 || b >= layers) {
      errors.Add(a + "blocks", StrCat("block index ", ValueText(blocks[i]),
                                      " is out of range [0, "
                                      "model.n_layer = ",
                                      layers, "); blocks count from 0"));
      blocks_ok = false;
    } else if (i > 0 && blocks[i] == blocks[i - 1]) {
      errors.Add(a + "blocks", StrCat("block index ", b, " is listed twice"));
      blocks_ok = false;
    }
  }
  if (!number.is_null() && count_ok && blocks_ok) {
    const bool first_n = static_cast<int64_t>(blocks.size()) == count &&
                         ClampedInt(blocks.back()) == count - 1;  // sorted, distinct, >= 0
    if (!first_n) {
      errors.Add(a + "blocks",
                 StrCat(blocks.dump(), " disagrees with number_checkpoints ", count, " (the first ",
                        count, " blocks); give only one of the two keys"));
    }
  }
}

// Note [Size limits] (core/sizes.h): the model's parameters, a micro-batch's tokens, logits and
// saved activations, and a step's tokens must each stay within kMaxElements, so that no size
// computed from them overflows. Runs after the batch triple is resolved.
void CheckSizes(const json& t, ConfigErrors& errors) {
  for (const char* key : {"model.n_head", "model.n_embd", "model.n_kv_head", "model.head_dim"}) {
    // ModelConfig holds them as int
    if (ClampedInt(At(t, key)) > INT32_MAX) {
      errors.Add(key, StrCat("must be <= ", INT32_MAX, ", got ", ValueText(At(t, key))));
      return;
    }
  }
  const int64_t c = ClampedInt(At(t, "model.n_embd")), layers = ClampedInt(At(t, "model.n_layer"));
  const int64_t vp = ClampedInt(At(t, "model.padded_vocab_size"));
  const int64_t max_t = ClampedInt(At(t, "model.max_seq_len"));
  if (c < 1 || layers < 1 || vp < 1 || max_t < 1) return;  // CheckModel names them
  const std::optional<int64_t> block = SizeSum(SizeProduct({12, c, c}), SizeProduct({13, c}));
  const std::optional<int64_t> params =
      SizeSum(SizeSum(SizeProduct({vp, c}), SizeProduct({max_t, c})),
              SizeSum(block ? SizeProduct({layers, *block}) : std::nullopt, SizeProduct({2, c})));
  if (!params) {
    errors.Add("model", StrCat("n_layer ", layers, ", n_embd ", c, ", padded_vocab_size ", vp,
                               " and max_seq_len ", max_t, " make more than ", kMaxElements,
                               " parameters (Note [Size limits]); lower them"));
  }
  const json &micro = At(t, "train_micro_batch_size_per_gpu"), &seq = At(t, "data.seq_len");
  const json &gas = At(t, "gradient_accumulation_steps"), &batch = At(t, "train_batch_size");
  if (!micro.is_number_integer() || !seq.is_number_integer() || !gas.is_number_integer() ||
      !batch.is_number_integer()) {
    return;  // the batch rules or CheckModel named them
  }
  const int64_t b = ClampedInt(micro), tokens = ClampedInt(seq);
  const std::string what = StrCat("train_micro_batch_size_per_gpu ", b, " x data.seq_len ", tokens);
  const std::string fix = "; lower train_micro_batch_size_per_gpu or data.seq_len";
  if (!SizeProduct({b, tokens})) {
    errors.Add("train_micro_batch_size_per_gpu",
               StrCat(what, " is more than ", kMaxElements, " tokens per micro-batch", fix));
  } else if (!SizeProduct({b, tokens, vp}) ||
             !SizeProduct({b, tokens, c, SizeSum(SizeProduct({16, layers}), 1).value_or(-1)})) {
    errors.Add("train_micro_batch_size_per_gpu", StrCat(what, " makes more than ", kMaxElements,
                                                        " logits or saved activations "
                                                        "per micro-batch (Note [Size limits])",
                                                        fix));
  } else if (!SizeProduct({ClampedInt(gas), b, tokens}) ||
             !SizeProduct({ClampedInt(batch), tokens})) {
    errors.Add("train_batch_size", StrCat("train_batch_size ", ValueText(batch), " x data.seq_len ",
                                          tokens, " is more than ", kMaxElements,
                                          " tokens per step (Note [Size limits]); lower it"));
  }
}

}  // namespace

void CheckRanges(const json& tree, ConfigErrors& errors) {
  CheckDevice(tree, errors);
  CheckModel(tree, errors);
  CheckSizes(tree, errors);
  CheckPackedDocuments(tree, errors);
  CheckTraining(tree, errors);
  CheckOptimizer(tree, errors);
  CheckScheduler(tree, errors);
  CheckParallelAndIo(tree, errors);
  CheckPrecision(tree, errors);
  CheckActivationCheckpointing(tree, errors);
  CheckLora(tree, errors);
  CheckQuantization(tree, errors);
}

}  // namespace ztrain::detail
