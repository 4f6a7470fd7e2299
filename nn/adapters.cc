// AdapterPlan (Note [Adapters and frozen parameters]).
#include "nn/adapters.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "core/error.h"
#include "nn/family.h"

namespace ztrain::nn {
namespace {

using ::ztrain::detail::StrCat;

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string List(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

std::string ModuleOf(const std::string& param) {
  const size_t dot = param.rfind('.');
  if (dot == std::string::npos) return param;
  const std::string last = param.substr(dot + 1);
  return last == "weight" || last == "bias" ? param.substr(0, dot) : param;
}

AdapterPlan::AdapterPlan(const LoraConfig& lora, const ModelConfig& model,
                         const QuantizationConfig& quantization)
    : enabled_(lora.enabled), lora_(lora), quantization_(quantization) {
  if (!enabled_) return;
  const ModelFamily& family = FindModelFamily(model.type);
  regex_ = lora.target_regex;
  if (!regex_.empty() && regex_ != "all-linear") compiled_ = std::regex(regex_);
  targets_ = lora.target_modules;
  if (regex_.empty() && targets_.empty()) targets_ = family.lora_targets;
  for (const HfTensor& t : family.hf.layout(model)) hf_names_[t.param] = t.hf_name;
  target_matched_.assign(targets_.size() + (regex_.empty() ? 0 : 1), false);
  save_matched_.assign(lora.modules_to_save.size(), false);
  skip_matched_.assign(quantization.skip_modules.size(), false);
  if (!model.tie_word_embeddings) return;
  for (const std::string& m : lora.modules_to_save) {
    for (const std::string& tied :
         {std::string("lm_head"), std::string("embed_tokens"), std::string("wte")}) {
      ZTRAIN_CHECK_T(ConfigError, !EndsWith(tied, m), "lora.modules_to_save: '", m,
                     "' is the token embedding, which this model "
                     "ties to its LM head (model.tie_word_embeddings); ztrain trains the shared "
                     "table as one: leave it out, or train a model with its own LM head");
    }
  }
}

std::string AdapterPlan::HfModule(const std::string& name) const {
  auto it = hf_names_.find(name + ".weight");
  if (it == hf_names_.end()) it = hf_names_.find(name);
  return ModuleOf(it == hf_names_.end() ? name : it->second);
}

bool AdapterPlan::Targets(const std::string& linear) const {
  bool any = false;
  const std::string module = HfModule(linear);  // what PEFT matches
  for (size_t i = 0; i < targets_.size(); ++i) {
    if (module == targets_[i] || EndsWith(module, "." + targets_[i])) {
      target_matched_[i] = true;
      any = true;
    }
  }
  if (!regex_.empty() && (regex_ == "all-linear" || std::regex_match(module, compiled_))) {
    target_matched_.back() = true;
    any = true;
  }
  return any;
}

std::optional<LoraAdapter> AdapterPlan::Lora(const std::string& linear, int block) const {
  if (!enabled_) return std::nullopt;
  const std::vector<int>& layers = lora_.layers_to_transform;
  const bool in_layers = layers.empty() || std::binary_search(layers.begin(), layers.end(), block);
  if (!Targets(linear) || !in_layers) return std::nullopt;
  return LoraAdapter{lora_.r, static_cast<float>(lora_.scaling()),
                     static_cast<float>(lora_.lora_dropout), lora_.init_lora_weights};
}

bool AdapterPlan::Trains(const std::string& name, bool bias, bool adapted) const {
  if (!enabled_) return true;
  if (bias && (lora_.bias == "all" || (lora_.bias == "lora_only" && adapted))) return true;
  const std::string module = HfModule(name);
  bool save = false;
  for (size_t i = 0; i < lora_.modules_to_save.size(); ++i) {
    if (EndsWith(module, lora_.modules_to_save[i])) {
      save_matched_[i] = true;
      save = true;
    }
  }
  return save;
}

kernels::QuantFormat AdapterPlan::Quantization(const std::string& linear) const {
  if (!enabled_ || !quantization_.enabled()) return {};
  // llm_int8_skip_modules: the module itself, a name it ends with, or a module it lies in.
  const std::string module = HfModule(linear);
  for (size_t i = 0; i < quantization_.skip_modules.size(); ++i) {
    const std::string& skip = quantization_.skip_modules[i];
    if (module == skip || EndsWith(module, "." + skip) ||
        module.find("." + skip + ".") != std::string::npos || module.rfind(skip + ".", 0) == 0) {
      skip_matched_[i] = true;
      return {};
    }
  }
  const std::string& type = quantization_.type;
  const kernels::QuantType t = type == "nf4"   ? kernels::QuantType::kNf4
                               : type == "fp4" ? kernels::QuantType::kFp4
                                               : kernels::QuantType::kInt8;
  return {t, t != kernels::QuantType::kInt8 && quantization_.double_quant};
}

std::vector<std::string> AdapterPlan::UnmatchedSkipModules() const {
  std::vector<std::string> unmatched;
  for (size_t i = 0; i < skip_matched_.size(); ++i) {
    if (!skip_matched_[i]) unmatched.push_back(quantization_.skip_modules[i]);
  }
  return unmatched;
}

void AdapterPlan::CheckAllMatched() const {
  if (!enabled_) return;
  std::vector<std::string> unmatched;
  for (size_t i = 0; i < targets_.size(); ++i) {
    if (!target_matched_[i]) unmatched.push_back(targets_[i]);
  }
  if (!regex_.empty() && !target_matched_.back()) unmatched.push_back("\"" + regex_ + "\"");
  ZTRAIN_CHECK_T(ConfigError, unmatched.empty(), "lora.target_modules: ", List(unmatched),
                 " matched no linear of the blocks",
                 lora_.layers_to_transform.empty() ? "" : " in lora.layers_to_transform",
                 " (Llama's are q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; "
                 "GPT-2's c_attn, c_proj, c_fc; the LM head and the embeddings take no "
                 "adapters: train them whole with lora.modules_to_save)");
  std::vector<std::string> unsaved;
  for (size_t i = 0; i < lora_.modules_to_save.size(); ++i) {
    if (!save_matched_[i]) unsaved.push_back(lora_.modules_to_save[i]);
  }
  ZTRAIN_CHECK_T(ConfigError, unsaved.empty(), "lora.modules_to_save: ", List(unsaved),
                 " matched no module of the model (e.g. lm_head, embed_tokens, norm)");
}

// PEFT's reset_lora_parameters: init_lora_weights true or false gives A nn.Linear's default,
// kaiming_uniform_(a = sqrt(5)) = uniform(+-1/sqrt(fan_in)); "gaussian" normal(0, 1/r).
void AdapterPlan::InitA(const LoraAdapter& adapter, int64_t in, ParamSpec& a) {
  if (adapter.init == "gaussian") {
    a.init = Init::kNormal;
    a.init_std = 1.0f / static_cast<float>(adapter.r);
    return;
  }
  a.init = Init::kUniform;
  a.init_std = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in)));
}

// B starts at zero (so the adapted model starts as the base) unless init_lora_weights is
// false, which leaves B nn.Linear's default too: uniform(+-1/sqrt(r)).
void AdapterPlan::InitB(const LoraAdapter& adapter, ParamSpec& b) {
  if (adapter.init != "false") {
    b.init = Init::kZeros;
    b.init_std = 0.0f;
    return;
  }
  b.init = Init::kUniform;
  b.init_std = static_cast<float>(1.0 / std::sqrt(static_cast<double>(adapter.r)));
}

}  // namespace ztrain::nn
