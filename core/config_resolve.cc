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

namespace ztrain::detail {
namespace {

using nlohmann::json;

int64_t RoundUp(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// Resolvers for "auto" that depend on other keys; every other "auto" becomes the schema
// default. The table is walked in schema order, so a resolver may read any key that comes
// earlier in the schema (optimizer before scheduler, model before data).
const std::vector<std::pair<std::string, std::function<json(const json&)>>>& AutoResolvers() {
  static const std::vector<std::pair<std::string, std::function<json(const json&)>>> table = {
      // Batch keys given as "auto" count as not given: the batch rules derive them.
      {"train_batch_size", [](const json&) { return json(nullptr); }},
      {"train_micro_batch_size_per_gpu", [](const json&) { return json(nullptr); }},
      {"gradient_accumulation_steps", [](const json&) { return json(nullptr); }},
      {"model.padded_vocab_size",
       [](const json& t) { return json(RoundUp(At(t, "model.vocab_size").get<int64_t>(), 128)); }},
      {"data.seq_len", [](const json& t) { return At(t, "model.max_seq_len"); }},
      {"scheduler.params.warmup_max_lr",
       [](const json& t) { return At(t, "optimizer.params.lr"); }},
      {"scheduler.params.total_num_steps", [](const json& t) { return At(t, "training.steps"); }},
      {"pipeline.stages", [](const json&) { return json(1); }},
      // Hugging Face's rules for ZeRO bucket sizes from the hidden size.
      {"zero_optimization.reduce_bucket_size",
       [](const json& t) {
         const int64_t h = At(t, "model.n_embd").get<int64_t>();
         return json(h * h);
       }},
      {"zero_optimization.stage3_prefetch_bucket_size",
       [](const json& t) {
         const int64_t h = At(t, "model.n_embd").get<int64_t>();
         return json(static_cast<int64_t>(0.9 * static_cast<double>(h * h)));
       }},
      {"zero_optimization.stage3_param_persistence_threshold",
       [](const json& t) { return json(10 * At(t, "model.n_embd").get<int64_t>()); }},
  };
  return table;
}

json ResolveAuto(const ConfigKey& key, const json& tree) {
  for (const auto& [path, resolve] : AutoResolvers()) {
    if (path == key.path) return resolve(tree);
  }
  return key.default_value;
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

void ResolveDerived(json& tree) {
  for (const ConfigKey& key : ConfigSchema::Get().keys()) {
    if (!key.auto_ok) continue;
    json* v = Find(tree, key.path);
    if (v && *v == "auto") *v = ResolveAuto(key, tree);
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
    train = *micro * *gas * ws;
  } else if (train) {
    gas = 1;
    micro = *train / ws;
  } else if (micro) {
    train = *micro * ws;
    gas = 1;
  } else {
    errors.Add("train_batch_size",
               "either train_batch_size or train_micro_batch_size_per_gpu must be given "
               "(e.g. \"train_micro_batch_size_per_gpu\": 8)");
    return;
  }
  if (*train != *micro * *gas * ws) {
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
                      " (= ", *micro * *gas * ws, ")", hint));
    return;
  }
  tree["train_batch_size"] = *train;
  tree["train_micro_batch_size_per_gpu"] = *micro;
  tree["gradient_accumulation_steps"] = *gas;
}

}  // namespace ztrain::detail
