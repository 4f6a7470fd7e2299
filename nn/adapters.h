#pragma once
// AdapterPlan: which parameters of a model train and which linears get LoRA adapters, from the
// config's `lora` section (PEFT's LoraConfig names).
//
// Note [Adapters and frozen parameters]
// LoRA (Hu et al., 2021, as PEFT implements it) is a property of parameters, not a layer
// (DESIGN.md "Model families"):
//   - BuildModel hands the plan to each layer's Adapt once the family has built it. A layer
//     made of the shared modules marks every parameter frozen (ParamSpec::trainable false)
//     except what the plan trains: a bias that `bias` names, a parameter of a module in
//     `modules_to_save`; and each linear the plan targets adds two trainable parameters
//     beside its weight, "<linear>.lora_A.weight" [r, in] and "<linear>.lora_B.weight"
//     [out, r] (Note [LoRA in the linears], nn/modules.h).
//   - Names are matched as PEFT matches them, on Hugging Face module names (a linear's weight's
//     HF name less ".weight": "model.layers.3.self_attn.q_proj"): a list of target_modules
//     takes a module equal to an entry or ending with "." + the entry ("q_proj",
//     "self_attn.q_proj", or PEFT's saved full names); a string is a regular expression
//     matched against the whole name; "all-linear" takes every linear of the blocks (PEFT:
//     every linear but the output layer). modules_to_save take a module whose name ends with
//     an entry. Only the blocks' linears take adapters: an entry that matches nothing, or
//     matches the LM head or an embedding, is a ConfigError naming what it matches.
//   - The engine keeps a frozen parameter in the compute dtype only, with no gradient and no
//     optimizer state, and shards it at ZeRO-3 (Note [Frozen parameters in the engine]);
//     the layers' backward skips the gradients of frozen parameters (Note [Frozen
//     parameters], kernels/ops.h).
// A default-constructed plan freezes nothing and adds nothing: the model as the family built
// it. Not thread safe while a model is being built (it counts what each target matched).
#include <optional>
#include <regex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/config.h"
#include "nn/layer.h"

namespace ztrain::nn {

// A parameter's module: its name less the last component (".weight", ".bias"); GPT-2's
// embedding tables "wte" and "wpe" are modules of their own.
std::string ModuleOf(const std::string& param);

// One linear's adapters: rank, scaling and how A and B start.
struct LoraAdapter {
  int r = 0;
  float scaling = 1.0f;
  std::string init = "true";  // LoraConfig::init_lora_weights
};

class AdapterPlan {
 public:
  AdapterPlan() = default;
  // The plan of `lora` for `model` (its family's default targets and Hugging Face names).
  // ConfigError for what cannot be adapted, naming the key and the fix.
  AdapterPlan(const LoraConfig& lora, const ModelConfig& model);

  bool enabled() const { return enabled_; }
  // The adapters of linear `linear` of block `block`, or nullopt.
  std::optional<LoraAdapter> Lora(const std::string& linear, int block) const;
  // Whether parameter `name` trains: `bias` of a linear with adapters (`adapted`) or
  // without; every other parameter of the base trains only in a module to save. Everything
  // trains without a plan.
  bool Trains(const std::string& name, bool bias, bool adapted) const;
  // After every layer adapted: ConfigError for a target or module to save that matched
  // nothing.
  void CheckAllMatched() const;

  // LoRA's initial values (PEFT's reset_lora_parameters): A and B of `adapter` for a linear
  // of `in` input features, as ParamSpec init and bound/std.
  static void InitA(const LoraAdapter& adapter, int64_t in, ParamSpec& a);
  static void InitB(const LoraAdapter& adapter, ParamSpec& b);

 private:
  // The Hugging Face module name of a ztrain linear or parameter name's module.
  std::string HfModule(const std::string& name) const;
  bool Targets(const std::string& linear) const;

  bool enabled_ = false;
  LoraConfig lora_;
  std::vector<std::string> targets_;  // suffixes (target_modules as a list, or the default)
  std::string regex_;                 // target_modules as a string; "all-linear"
  std::regex compiled_;               // regex_ unless "all-linear"
  std::unordered_map<std::string, std::string> hf_names_;  // ztrain parameter -> HF name
  mutable std::vector<bool> target_matched_, save_matched_;
};

}  // namespace ztrain::nn
