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
//     optimizer state, and shards it at ZeRO-3 (Note [Frozen regions],
//     parallel/zero/frozen_regions.h); the layers' backward skips the gradients of frozen
//     parameters (Note [Frozen parameters], kernels/ops.h).
// A default-constructed plan freezes nothing and adds nothing: the model as the family built
// it. Not thread safe while a model is being built (it counts what each target matched).
//
// Note [Quantized base]
// With a `quantization` section (QLoRA: Dettmers et al., 2023, as bitsandbytes and
// transformers' BitsAndBytesConfig do it) the frozen weights of the blocks' linears are kept
// quantized: NF4 or FP4 in blocks of 64 with an fp32 absmax each (or double-quantized), or
// INT8 with an fp32 absmax per row (kernels/quant.h). Biases, norms, the embeddings and the
// LM head stay in the compute dtype, as transformers leaves them, and so do the linears named
// by llm_int8_skip_modules. Then:
//   - Linear::Adapt marks each such weight (ParamSpec::quant) with the geometry of its piece:
//     all of it, or its tensor-parallel slice. A piece is quantized from the WHOLE weight, so
//     its codes and scales are the single-process model's and every layout computes with the
//     same weights (kernels/quant.h); 4-bit pieces need their columns in whole blocks of 64
//     (a ConfigError names the weight otherwise).
//   - The engine stores the piece's blob in the frozen region instead of its values, quantizes
//     it while loading, one weight at a time, from the whole weight in fp32, and at ZeRO-3
//     shards, gathers and offloads the blob's bytes (Note [Frozen regions],
//     parallel/zero/frozen_regions.h).
//   - A linear dequantizes its weight into the compute dtype just before each GEMM that reads
//     it (forward, and the input gradient in backward) and frees it after: at most the weights
//     of the linears that read one input (SwiGLU's gate and up) are ever dequantized at once.
//     The values are bitsandbytes' dequantized weights, so with fp32 compute a step is the
//     fp32 step of a model whose base IS those values.
// A packed q/k/v run is quantized whole or not at all (one GEMM computes it).
#include <optional>
#include <regex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/config.h"
#include "kernels/quant.h"
#include "nn/layer.h"

namespace ztrain::nn {

// A parameter's module: its name less the last component (".weight", ".bias"); GPT-2's
// embedding tables "wte" and "wpe" are modules of their own.
std::string ModuleOf(const std::string& param);

// One linear's adapters: rank, scaling and how A and B start.
struct LoraAdapter {
  int r = 0;
  float scaling = 1.0f;
  float dropout = 0.0f;  // lora_dropout: the probability of dropping an input element
  std::string init = "true";  // LoraConfig::init_lora_weights
};

class AdapterPlan {
 public:
  AdapterPlan() = default;
  // The plan of `lora` for `model` (its family's default targets and Hugging Face names).
  // ConfigError for what cannot be adapted, naming the key and the fix.
  AdapterPlan(const LoraConfig& lora, const ModelConfig& model,
              const QuantizationConfig& quantization = {});
  // The plan of a run: its lora and quantization sections for its model.
  explicit AdapterPlan(const Config& config)
      : AdapterPlan(config.lora, config.model, config.quantization) {}

  bool enabled() const { return enabled_; }
  // The adapters of linear `linear` of block `block`, or nullopt.
  std::optional<LoraAdapter> Lora(const std::string& linear, int block) const;
  // Whether parameter `name` trains: `bias` of a linear with adapters (`adapted`) or
  // without; every other parameter of the base trains only in a module to save. Everything
  // trains without a plan.
  bool Trains(const std::string& name, bool bias, bool adapted) const;
  // How block linear `linear`'s frozen weight is stored (Note [Quantized base]): quantized, or
  // (type kNone) in the compute dtype.
  kernels::QuantFormat Quantization(const std::string& linear) const;
  // After every layer adapted: ConfigError for a target or module to save that matched
  // nothing.
  void CheckAllMatched() const;
  // After every layer adapted: the quantization.llm_int8_skip_modules entries that left no
  // linear unquantized (bitsandbytes ignores them silently; ztrain warns, naming them).
  std::vector<std::string> UnmatchedSkipModules() const;

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
  QuantizationConfig quantization_;
  std::vector<std::string> targets_;  // suffixes (target_modules as a list, or the default)
  std::string regex_;                 // target_modules as a string; "all-linear"
  std::regex compiled_;               // regex_ unless "all-linear"
  std::unordered_map<std::string, std::string> hf_names_;  // ztrain parameter -> HF name
  mutable std::vector<bool> target_matched_, save_matched_, skip_matched_;
};

}  // namespace ztrain::nn
