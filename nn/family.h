#pragma once
// Model families and their registry (DESIGN.md "Model families"). A family is a builder:
// model config in, layer list out, composed of the shared layers (nn/transformer.h) on a
// LinearProvider, which says how the linears are split (Note [Linears handed to the
// builder]). Families are registered in one explicit function (family.cc); model.type
// resolves through it, and so do the checks that a model splits over a tensor-parallel group.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "nn/adapters.h"
#include "nn/hf_family.h"
#include "nn/layer.h"
#include "nn/linear_provider.h"

namespace ztrain::nn {

using LayerList = std::vector<std::unique_ptr<Layer>>;

struct ModelFamily {
  std::string type;         // model.type
  std::string description;  // for docs and errors
  std::function<LayerList(const ModelConfig&, std::shared_ptr<const LinearProvider>)> build;
  // What the family cannot build of `model` (a key it does not take, an impossible shape),
  // each with the fix.
  std::function<std::vector<std::string>(const ModelConfig&)> config_problems;
  // The family's own reasons `model` cannot split over `tp` pieces, each with its fix ("" for
  // none); CheckTensorParallelModel adds the ones every family shares.
  std::function<std::vector<std::string>(const ModelConfig&, int tp)> tp_problems;
  HfFamily hf;  // Hugging Face directories in and out (nn/hf_checkpoint.h)
  // The linears LoRA adapts when lora.target_modules is null: PEFT's default for the family
  // (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
  std::vector<std::string> lora_targets;
};

// The family whose HfFamily reads `hf_config` (config.json's "architectures", else its
// "model_type"); ConfigError naming what the file says and what ztrain reads otherwise.
const ModelFamily& FindHfFamily(const nlohmann::json& hf_config, const std::string& path);

// Every registered family, in registration order.
const std::vector<ModelFamily>& ModelFamilies();
// The family of model.type `type`; ConfigError naming the known ones otherwise.
const ModelFamily& FindModelFamily(const std::string& type);

// Throws ConfigError listing everything `model`'s family refuses in it (CheckModel), so
// check-config and train refuse the same.
void CheckModel(const ModelConfig& model);

// The model of config `model` (checked), its linears from `provider` (whole by default),
// adapted as `plan` says (Note [Adapters and frozen parameters], nn/adapters.h).
LayerList BuildModel(const ModelConfig& model,
                     std::shared_ptr<const LinearProvider> provider = MakeWholeLinears(),
                     const AdapterPlan& plan = AdapterPlan());

// Throws ConfigError listing every way `model` cannot be split over `tp_size` ranks (heads,
// channels, padded vocabulary not divisible), each with the fix. Collective-free.
void CheckTensorParallelModel(const ModelConfig& model, int tp_size);

// "<key> <value> does not divide by tensor_parallel.size <tp>; use a size that divides it
// (1, 2, ...): each rank runs <key> / size whole attention heads", or "" when it divides.
std::string HeadSplitProblem(const char* key, int64_t heads, int tp);
// "<key> <value> does not divide by tensor_parallel.size <tp>; <fix>", or "".
std::string DivisibilityProblem(const char* key, int64_t value, int tp, const std::string& fix);

}  // namespace ztrain::nn
