// The DeepSpeed features ztrain parses but does not run yet, as one table (pass 4 of
// ParseConfig). A feature is never silently ignored: a config that asks for it is refused
// with a message naming the key. When a feature lands, delete its entry here.
#include <algorithm>
#include <utility>

#include "core/config_internal.h"
#include "core/config_schema.h"

namespace ztrain {
namespace {

using nlohmann::json;
using Check = std::function<std::optional<std::string>(const json&)>;

Check IsTrue() {
  return [](const json& v) -> std::optional<std::string> {
    if (v == true) return "";
    return std::nullopt;
  };
}
Check GreaterThan(int64_t limit) {
  return [limit](const json& v) -> std::optional<std::string> {
    if (v.is_number() && v.get<double>() > static_cast<double>(limit)) return "";
    return std::nullopt;
  };
}
Check NotNull() {
  return [](const json& v) -> std::optional<std::string> {
    if (!v.is_null()) return "";
    return std::nullopt;
  };
}
// Refuses any string not in `allowed` (case-insensitively); null is allowed.
Check NotIn(std::vector<std::string> allowed) {
  return [allowed](const json& v) -> std::optional<std::string> {
    if (!v.is_string()) return std::nullopt;
    for (const std::string& a : allowed) {
      if (detail::EqualsIgnoreCase(a, v.get<std::string>())) return std::nullopt;
    }
    return "";
  };
}
// Free-form sections: refused when any "enabled" inside them is true; returns its path.
Check AnyEnabled() {
  return [](const json& v) -> std::optional<std::string> {
    if (!v.is_object()) return std::nullopt;
    if (v.contains("enabled") && v["enabled"] == true) return ".enabled";
    for (const auto& [name, child] : v.items()) {
      if (auto found = AnyEnabled()(child)) return "." + name + *found;
    }
    return std::nullopt;
  };
}

std::string JoinTypes(const std::vector<std::string>& types) {
  std::string s;
  for (const std::string& t : types) s += (s.empty() ? "" : ", ") + t;
  return s;
}

ConfigRefusal R(std::string path, std::string when, std::string why, Check check) {
  return ConfigRefusal{std::move(path), std::move(when), std::move(why), std::move(check)};
}

std::vector<ConfigRefusal> BuildRefusals() {
  const std::string z = "zero_optimization.";
  const std::string not_built = " is not built yet";
  std::vector<ConfigRefusal> r = {
      R(z + "zero_quantized_weights", "true", "ZeRO++ weight quantisation" + not_built, IsTrue()),
      R(z + "zero_quantized_nontrainable_weights", "true", "ZeRO++ weight quantisation" + not_built,
        IsTrue()),
      R(z + "zero_quantized_gradients", "true", "ZeRO++ gradient quantisation" + not_built,
        IsTrue()),
      R(z + "zero_hpz_partition_size", "> 1", "ZeRO++ hierarchical partitioning" + not_built,
        GreaterThan(1)),
      R(z + "mics_shard_size", "> 0", "MiCS sharding" + not_built, GreaterThan(0)),
      R("fp16.auto_cast", "true",
        "ztrain does not autocast: with fp16.enabled every op computes in fp16 from fp32 "
        "master weights; set auto_cast to false",
        IsTrue()),
      R("fp16.fp16_master_weights_and_grads", "true",
        "fp16 master weights and gradients are not built; ztrain keeps fp32 master weights "
        "(fp16 gradients: data_types.grad_accum_dtype)",
        IsTrue()),
      R("bf16.bf16_master_weights_and_grads", "true",
        "bf16 master weights and gradients are not built; ztrain keeps fp32 master weights "
        "(bf16 gradients: data_types.grad_accum_dtype)",
        IsTrue()),
      R("bf16.bf16_optimizer_states", "true",
        "bf16 optimizer states are not built; ztrain keeps them in fp32", IsTrue()),
      R("amp", "enabled",
        "Apex AMP is not available; use \"bf16\": {\"enabled\": true} or \"fp16\": "
        "{\"enabled\": true}",
        AnyEnabled()),
      R("torch_autocast", "enabled",
        "autocast is not available; use \"bf16\": {\"enabled\": true} or \"fp16\": "
        "{\"enabled\": true}",
        AnyEnabled()),
      R("communication_data_type", "not fp32",
        "{} gradient communication is not built yet; use \"fp32\" or null", NotIn({"fp32"})),
      R("optimizer.type", "not Adam/AdamW",
        "optimizer {} is not built yet; supported: " + JoinTypes(SupportedOptimizerTypes()),
        NotIn(SupportedOptimizerTypes())),
      R("optimizer.params.amsgrad", "true", "AMSGrad" + not_built, IsTrue()),
      R("optimizer.params.max_grad_norm", "> 0",
        "DeepSpeed ignores max_grad_norm in fp32 training; use top-level \"gradient_clipping\"",
        GreaterThan(0)),
      R("scheduler.type", "not WarmupLR/WarmupDecayLR/WarmupCosineLR",
        "scheduler {} is not built yet; supported (exact spelling): " +
            JoinTypes(SupportedSchedulerTypes()),
        [](const json& v) -> std::optional<std::string> {
          const auto& types = SupportedSchedulerTypes();
          if (!v.is_string()) return std::nullopt;
          if (std::find(types.begin(), types.end(), v.get<std::string>()) == types.end()) {
            return "";
          }
          return std::nullopt;
        }),
      R("sparse_gradients", "true", "sparse (CSR) gradient all-reduce" + not_built, IsTrue()),
      R("pipeline.activation_checkpoint_interval", "> 0",
        "checkpointing every N pipeline layers" + not_built +
            "; use activation_checkpointing.enabled (every block) or activation_checkpointing."
            "blocks",
        GreaterThan(0)),
      R("tensor_parallel.autotp_size", "> 1",
        "DeepSpeed's AutoTP" + not_built + "; use tensor_parallel.size (Megatron-style splits)",
        GreaterThan(1)),
      R("tensor_parallel.tp.tp_size", "> 1",
        "DeepSpeed's AutoTP" + not_built + "; use tensor_parallel.size (Megatron-style splits)",
        GreaterThan(1)),
      R("checkpoint.load_universal", "true", "loading DeepSpeed universal checkpoints" + not_built,
        IsTrue()),
      R("flops_profiler.enabled", "true", "the FLOPs profiler" + not_built, IsTrue()),
      R("tensorboard.enabled", "true",
        "the TensorBoard monitor" + not_built + "; csv_monitor writes the same metrics", IsTrue()),
      R("wandb.enabled", "true", "the W&B monitor" + not_built + "; use csv_monitor", IsTrue()),
      R("comet.enabled", "true", "the Comet monitor" + not_built + "; use csv_monitor", IsTrue()),
      R("sparse_attention", "present", "sparse attention" + not_built, NotNull()),
      R("weight_quantization", "present", "weight quantisation" + not_built, NotNull()),
  };
  for (const char* section : {"elasticity", "autotuning", "compression_training", "data_efficiency",
                              "curriculum_learning", "progressive_layer_drop", "eigenvalue",
                              "quantize_training", "hybrid_engine", "nebula", "compile"}) {
    r.push_back(R(section, "enabled", std::string(section) + not_built, AnyEnabled()));
  }
  return r;
}

}  // namespace

const std::vector<ConfigRefusal>& ConfigRefusals() {
  static const std::vector<ConfigRefusal> refusals = BuildRefusals();
  return refusals;
}

namespace detail {

void CheckRefusals(const json& tree, ConfigErrors& errors) {
  for (const ConfigRefusal& r : ConfigRefusals()) {
    const json* v = Find(tree, r.path);
    if (!v) continue;
    const std::optional<std::string> where = r.refuses(*v);
    if (!where) continue;
    std::string why = r.why;
    const size_t slot = why.find("{}");
    if (slot != std::string::npos) why.replace(slot, 2, ValueText(*v, /*quote=*/false));
    errors.Add(r.path + *where, why);
  }
}

}  // namespace detail
}  // namespace ztrain
