// Passes 2 and 3 of ParseConfig: values derived from other keys ("auto" and friends), and
// the batch triple exactly as DeepSpeed's DeepSpeedConfig._set_batch_related_parameters and
// _batch_assertion (deepspeed/runtime/config.py).
#include <algorithm>
#include <functional>
#include <optional>
#include <utility>

#include "core/config_internal.h"
#include "core/config_schema.h"
#include "core/error.h"
#include "core/sizes.h"

namespace ztrain::detail {
namespace {

using nlohmann::json;

int64_t RoundUp(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// Note [Resolving "auto"]
// Every "auto" ParseConfig resolves, with the reason it gives (Config::auto_choices, logged at
// start and printed by check-config). Keys a Hugging Face Trainer config leaves "auto" take
// what the HF Trainer fills in (transformers' integrations/deepspeed.py trainer_config_process
// and trainer_config_finalize, with TrainingArguments' defaults); the rest follow from other
// keys or take the schema default. The table is walked in schema order, so a rule may read any
// key that comes earlier in the schema (optimizer before scheduler, model before data).
// train_micro_batch_size_per_gpu and bf16.enabled depend on the machine: run/run_config.h
// resolves them before ParseConfig; here an "auto" micro-batch counts as not given and an
// "auto" bf16 as false.
struct AutoRule {
  const char* path;
  std::function<json(const json&)> value;
  const char* reason;
};

json Hidden(const json& t, double factor, int64_t power) {
  const int64_t h = At(t, "model.n_embd").get<int64_t>();
  const int64_t v = (power == 2 ? SizeProduct({h, h}) : SizeProduct({h})).value_or(kMaxElements);
  return json(static_cast<int64_t>(factor * static_cast<double>(v)));
}

const std::vector<AutoRule>& AutoRules() {
  static const std::vector<AutoRule> table = {
      {"train_batch_size", [](const json&) { return json(nullptr); },
       "train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel ranks"},
      {"train_micro_batch_size_per_gpu", [](const json&) { return json(nullptr); },
       "not resolved here: ztrain resolves it from the device's memory before parsing"},
      {"gradient_accumulation_steps", [](const json&) { return json(1); },
       "the HF Trainer's default gradient_accumulation_steps"},
      {"gradient_clipping", [](const json&) { return json(1.0); },
       "the HF Trainer's default max_grad_norm"},
      {"optimizer.params.lr", [](const json&) { return json(5e-5); },
       "the HF Trainer's default learning_rate"},
      {"optimizer.params.betas", [](const json&) { return json::array({0.9, 0.999}); },
       "the HF Trainer's default adam_beta1, adam_beta2"},
      {"optimizer.params.eps", [](const json&) { return json(1e-8); },
       "the HF Trainer's default adam_epsilon"},
      {"optimizer.params.weight_decay", [](const json&) { return json(0.0); },
       "the HF Trainer's default weight_decay"},
      {"scheduler.params.warmup_min_lr", [](const json&) { return json(0.0); },
       "0, as the HF Trainer fills it"},
      {"scheduler.params.warmup_max_lr", [](const json& t) { return At(t, "optimizer.params.lr"); },
       "optimizer.params.lr, as the HF Trainer fills it with learning_rate"},
      {"scheduler.params.warmup_num_steps", [](const json&) { return json(0); },
       "the HF Trainer's default warmup_steps (DeepSpeed then warms up over 2 steps)"},
      {"scheduler.params.total_num_steps", [](const json& t) { return At(t, "training.steps"); },
       "training.steps, as the HF Trainer fills it with the run's steps"},
      {"fp16.enabled", [](const json&) { return json(false); },
       "the HF Trainer's default fp16 (false)"},
      {"bf16.enabled", [](const json&) { return json(false); },
       "not resolved by the hardware here (run/run_config.h does): false"},
      {"model.padded_vocab_size",
       [](const json& t) {
         const int64_t v = ClampedInt(At(t, "model.vocab_size"));
         return json(v > kMaxElements ? v : RoundUp(v, 128));  // CheckSizes names a huge one
       },
       "model.vocab_size rounded up to a multiple of 128"},
      {"data.seq_len", [](const json& t) { return At(t, "model.max_seq_len"); },
       "model.max_seq_len"},
      // 0 follows the other sizes (ModelConfig's accessors), also when model.init_from's
      // header sets them after this pass.
      {"model.n_kv_head", [](const json&) { return json(0); }, "0: model.n_head"},
      {"model.head_dim", [](const json&) { return json(0); }, "0: model.n_embd / model.n_head"},
      {"model.intermediate_size", [](const json&) { return json(0); }, "0: 4 model.n_embd"},
      {"pipeline.stages", [](const json&) { return json(1); }, "no pipeline"},
      {"zero_optimization.reduce_bucket_size", [](const json& t) { return Hidden(t, 1.0, 2); },
       "model.n_embd^2, the HF Trainer's rule for the hidden size"},
      {"zero_optimization.stage3_prefetch_bucket_size",
       [](const json& t) { return Hidden(t, 0.9, 2); },
       "0.9 model.n_embd^2, the HF Trainer's rule for the hidden size"},
      {"zero_optimization.stage3_param_persistence_threshold",
       [](const json& t) { return Hidden(t, 10.0, 1); },
       "10 model.n_embd, the HF Trainer's rule for the hidden size"},
  };
  return table;
}

AutoChoice ResolveAuto(const ConfigKey& key, const json& tree) {
  for (const AutoRule& rule : AutoRules()) {
    if (rule.path == key.path) return {key.path, rule.value(tree), rule.reason};
  }
  return {key.path, key.default_value, "the default"};
}

void CanonicaliseOptimizerType(json& tree) {
  json& type = At(tree, "optimizer.type");
  for (const std::string& t : SupportedOptimizerTypes()) {
    if (EqualsIgnoreCase(t, type.get<std::string>())) type = t;
  }
}

std::optional<int64_t> OptionalInt(const json& tree, const char* path) {
  const json& v = At(tree, path);
  return v.is_null() ? std::nullopt : std::optional<int64_t>(v.get<int64_t>());
}

// Note [Mixed precision config]
// bf16.enabled or fp16.enabled chooses the dtype the model computes in (ComputeDType); both
// is an error, neither is fp32. Master weights and optimizer state stay fp32 in every case
// (the *_master_weights_and_grads keys are refused). data_types.grad_accum_dtype null
// resolves to fp16 when training in fp16 (DeepSpeed's fp16 optimizers keep fp16 gradients)
// and to fp32 otherwise, bf16 included: a sum over many micro-batches keeps its precision.
// DeepSpeed defaults to bf16 gradients there (fp32 in older releases without ZeRO); the
// setting "bf16" matches it. A 16-bit accumulation dtype needs training in that same dtype
// (CheckRanges). DeepSpeed's spellings (its DtypeEnum: "half", "float16", "torch.bfloat16",
// ...) resolve to "fp32", "fp16" or "bf16".
void ResolveGradAccumDType(json& tree) {
  static const std::pair<const char*, const char*> kSpellings[] = {
      {"float32", "fp32"},  {"float", "fp32"},         {"torch.float32", "fp32"},
      {"float16", "fp16"},  {"half", "fp16"},          {"torch.float16", "fp16"},
      {"bfloat16", "bf16"}, {"torch.bfloat16", "bf16"}};
  json& dtype = At(tree, "data_types.grad_accum_dtype");
  if (dtype.is_null()) {
    dtype = At(tree, "fp16.enabled") == true ? "fp16" : "fp32";
    return;
  }
  for (const auto& [spelling, name] : kSpellings) {
    if (dtype == spelling) dtype = name;
  }
}

// Note [Activation checkpointing config]
// DeepSpeed's section only tunes the checkpointing that model code asks for
// (deepspeed.checkpointing.checkpoint); ztrain checkpoints whole transformer blocks and
// chooses them here. `enabled` null resolves to true when the section says which blocks
// (number_checkpoints, blocks) or how to checkpoint (partition_activations or
// cpu_checkpointing true), else false. When enabled, `blocks` resolves to the sorted list of
// checkpointed blocks: as given, else the first number_checkpoints, else all model.n_layer.
// So the resolved config names every checkpointed block and parses to itself again (both
// keys given must agree, CheckRanges). Values out of range are left for CheckRanges to name.
void ResolveActivationCheckpointing(json& tree) {
  json& ac = At(tree, "activation_checkpointing");
  json& enabled = ac["enabled"];
  json& blocks = ac["blocks"];
  const json& number = ac["number_checkpoints"];
  if (enabled.is_null()) {
    enabled = !number.is_null() || !blocks.is_null() || ac["partition_activations"] == true ||
              ac["cpu_checkpointing"] == true;
  }
  if (blocks.is_array()) {
    std::sort(blocks.begin(), blocks.end());
    return;
  }
  const json& n_layer = At(tree, "model.n_layer");
  if (enabled != true || !n_layer.is_number_integer()) return;
  const int64_t layers = n_layer.get<int64_t>();
  if (layers < 1 || layers > kMaxLayers) return;
  const int64_t count = number.is_null() ? layers : ClampedInt(number);
  if (count < 1 || count > layers) return;
  blocks = json::array();
  for (int64_t i = 0; i < count; ++i) blocks.push_back(i);
}

}  // namespace

void ResolveDerived(json& tree, std::vector<AutoChoice>& choices) {
  for (const ConfigKey& key : ConfigSchema::Get().keys()) {
    if (!key.auto_ok) continue;
    json* v = Find(tree, key.path);
    if (!v || *v != "auto") continue;
    AutoChoice choice = ResolveAuto(key, tree);
    *v = choice.value;
    if (!choice.value.is_null()) choices.push_back(std::move(choice));
  }
  CanonicaliseOptimizerType(tree);
  ResolveGradAccumDType(tree);
  ResolveActivationCheckpointing(tree);
  json& overlap = At(tree, "zero_optimization.overlap_comm");
  if (overlap.is_null()) overlap = At(tree, "zero_optimization.stage") == 3;
  json& output_dir = At(tree, "training.output_dir");
  if (output_dir == "") output_dir = "runs/" + At(tree, "training.job_name").get<std::string>();
  for (const char* monitor : {"csv_monitor.output_path", "tensorboard.output_path"}) {
    json& out = At(tree, monitor);
    if (out == "") out = At(tree, "training.output_dir");
  }
}

void ResolveBatchSize(json& tree, int world_size, ConfigErrors& errors) {
  if (world_size < 1) {
    errors.Add("train_batch_size", StrCat("world size must be >= 1, got ", world_size));
    return;
  }
  const int64_t ws = world_size;
  std::optional<int64_t> train = OptionalInt(tree, "train_batch_size");
  std::optional<int64_t> micro = OptionalInt(tree, "train_micro_batch_size_per_gpu");
  std::optional<int64_t> gas = OptionalInt(tree, "gradient_accumulation_steps");
  bool nonpositive = false;
  for (const auto& [name, v] : {std::pair{"train_batch_size", train},
                                {"train_micro_batch_size_per_gpu", micro},
                                {"gradient_accumulation_steps", gas}}) {
    if (v && *v <= 0) errors.Add(name, StrCat("must be > 0, got ", *v));
    nonpositive = nonpositive || (v && *v <= 0);
  }
  if (nonpositive) return;
  const bool derived_gas = train && micro && !gas;
  const bool derived_micro = train && !micro;
  // The same cases, in the same order, as DeepSpeed; divisions truncate as Python's //.
  if (train && micro && gas) {
  } else if (train && micro) {
    gas = *micro > 0 ? *train / *micro / ws : 0;
  } else if (train && gas) {
    micro = *gas > 0 ? *train / ws / *gas : 0;
  } else if (micro && gas) {
    train = SizeProduct({*micro, *gas, ws}).value_or(-1);
  } else if (train) {
    gas = 1;
    micro = *train / ws;
  } else if (micro) {
    train = SizeProduct({*micro, ws}).value_or(-1);
    gas = 1;
  } else {
    errors.Add("train_batch_size",
               "either train_batch_size or train_micro_batch_size_per_gpu must be given "
               "(e.g. \"train_micro_batch_size_per_gpu\": 8)");
    return;
  }
  const std::optional<int64_t> product = SizeProduct({*micro, *gas, ws});
  if (!product) {
    errors.Add("train_batch_size",
               StrCat("train_micro_batch_size_per_gpu ", *micro, " x gradient_accumulation_steps ",
                      *gas, " x world_size ", ws, " exceeds ", kMaxElements,
                      " sequences (Note [Size limits]); use a micro-batch that fits the device"));
    return;
  }
  if (*train != *product) {
    std::string hint = "; fix one of them, or give only two and let the third be derived";
    if (derived_gas || derived_micro) {
      hint = StrCat("; train_batch_size must be a multiple of ",
                    derived_gas ? "train_micro_batch_size_per_gpu x world_size = "
                                : "gradient_accumulation_steps x world_size = ",
                    derived_gas ? *micro * ws : *gas * ws);
    }
    errors.Add("train_batch_size",
               StrCat("train_batch_size ", *train, " != train_micro_batch_size_per_gpu ", *micro,
                      " x gradient_accumulation_steps ", *gas, " x world_size ", ws,
                      " (= ", *product, ")", hint));
    return;
  }
  tree["train_batch_size"] = *train;
  tree["train_micro_batch_size_per_gpu"] = *micro;
  tree["gradient_accumulation_steps"] = *gas;
}

}  // namespace ztrain::detail
