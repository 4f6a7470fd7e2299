#pragma once
// PEFT adapter directories, as PEFT's save_pretrained writes them: adapter_config.json (the
// LoraConfig) and adapter_model.safetensors (the trained tensors), for a model's LoRA
// adapters (Note [Adapters and frozen parameters], nn/adapters.h).
//
// Names: PEFT wraps the Hugging Face model (PeftModel.base_model.model), so a tensor is
// "base_model.model." + its Hugging Face name: a linear's adapters "<module>.lora_A.weight"
// [r, in] and "<module>.lora_B.weight" [out, r] (PEFT saves no adapter name), the bias of an
// adapted linear "<module>.base_layer.bias" (PEFT's LoRA layer wraps the base), any other
// trained bias or module to save under its own Hugging Face name. The shapes are the whole
// tensors'; the tied, padded and transposed cases are the family's (nn/hf_family.h).
// Read with nn::HfCheckpoint(dir, kPeftAdapterFiles) and ReadHfParameter.
// Errors: ConfigError for a directory or config ztrain cannot use, naming the key and the fix;
// IoError for files.
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "nn/hf_family.h"

namespace ztrain::nn {

// Every trainable tensor of `model` adapted by `lora`, in model order; hf_name is the PEFT
// name.
std::vector<HfTensor> PeftLayout(const ModelConfig& model, const LoraConfig& lora);

// adapter_config.json for `lora` on `model`: PEFT's LoraConfig keys with PEFT's defaults
// where ztrain has no setting, target_modules resolved to the linears' names as PEFT saves
// them, base_model_name_or_path = model.init_from.
nlohmann::json PeftConfigJson(const LoraConfig& lora, const ModelConfig& model);

// The `lora` section keys the adapter_config.json of `dir` sets (r, lora_alpha, ...). A
// setting ztrain does not run (DoRA, rank or alpha patterns, ...) is a ConfigError naming it.
nlohmann::json ReadPeftConfig(const std::string& dir);

// Writes `dir` (made if needed): adapter_config.json and adapter_model.safetensors, whose
// tensors `value(param)` gives as whole fp32 values (the layout's param_shape), written as
// `dtype` (kF32, kBF16 or kF16). Each file is written to a temporary and renamed into place.
void WritePeftAdapter(const std::string& dir, const ModelConfig& model, const LoraConfig& lora,
                      DType dtype, const std::function<const float*(const std::string&)>& value);

}  // namespace ztrain::nn
