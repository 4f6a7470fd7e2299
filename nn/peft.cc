// PEFT adapter directories (nn/peft.h).
#include "nn/peft.h"

#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "nn/adapters.h"
#include "nn/family.h"
#include "nn/hf_checkpoint.h"
#include "nn/model_file_util.h"
#include "nn/safetensors.h"

namespace ztrain::nn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::ztrain::detail::StrCat;

constexpr const char* kPrefix = "base_model.model.";  // PeftModel.base_model.model
constexpr const char* kLoraA = ".lora_A.weight";
constexpr const char* kLoraB = ".lora_B.weight";

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string WithoutSuffix(const std::string& s, const std::string& suffix) {
  return s.substr(0, s.size() - suffix.size());
}

// LoraConfig keys ztrain runs only at PEFT's default, with that default (null: absent or
// null; {}: absent, null or empty).
const std::vector<std::pair<const char*, json>>& DefaultOnlyKeys() {
  static const std::vector<std::pair<const char*, json>> keys = {
      {"use_dora", false},
      {"rank_pattern", json::object()},
      {"alpha_pattern", json::object()},
      {"layer_replication", nullptr},
      {"loftq_config", json::object()},
      {"megatron_config", nullptr},
      {"trainable_token_indices", nullptr},
      {"lora_bias", false},
      {"target_parameters", nullptr},
      {"exclude_modules", nullptr},
      {"use_qalora", false},
      {"alora_invocation_tokens", nullptr},
      {"eva_config", nullptr},
      {"corda_config", nullptr}};
  return keys;
}

bool IsDefault(const json& value, const json& fallback) {
  if (value.is_null()) return true;
  if (fallback.is_object() && value.is_object()) return value.empty();
  return value == fallback;
}

}  // namespace

std::vector<HfTensor> PeftLayout(const ModelConfig& model, const LoraConfig& lora) {
  const ModelFamily& family = FindModelFamily(model.type);
  std::map<std::string, HfTensor> base;
  for (const HfTensor& t : family.hf.layout(model)) base.emplace(t.param, t);
  std::vector<ParamSpec> specs;
  for (const auto& layer : BuildModel(model, MakeWholeLinears(), AdapterPlan(lora, model))) {
    for (const ParamSpec& s : layer->Params()) {
      if (s.tied_to.empty()) specs.push_back(s);
    }
  }
  std::set<std::string> adapted;  // linears with adapters
  for (const ParamSpec& s : specs) {
    if (EndsWith(s.name, kLoraA)) adapted.insert(WithoutSuffix(s.name, kLoraA));
  }
  std::vector<HfTensor> out;
  for (const ParamSpec& s : specs) {
    if (!s.trainable) continue;
    for (const char* suffix : {kLoraA, kLoraB}) {
      if (!EndsWith(s.name, suffix)) continue;
      const std::string module =
          ModuleOf(base.at(WithoutSuffix(s.name, suffix) + ".weight").hf_name);
      out.push_back({kPrefix + module + suffix, s.shape, s.name, s.shape, false});
    }
    if (EndsWith(s.name, kLoraA) || EndsWith(s.name, kLoraB)) continue;
    HfTensor t = base.at(s.name);
    if (EndsWith(s.name, ".bias") && adapted.count(WithoutSuffix(s.name, ".bias")) != 0) {
      t.hf_name = ModuleOf(t.hf_name) + ".base_layer.bias";  // inside PEFT's LoRA wrapper
    }
    t.hf_name = kPrefix + t.hf_name;
    out.push_back(std::move(t));
  }
  return out;
}

json PeftConfigJson(const LoraConfig& lora, const ModelConfig& model) {
  // target_modules as PEFT saves them once resolved: the adapted linears' names.
  std::set<std::string> targets;
  for (const HfTensor& t : PeftLayout(model, lora)) {
    if (!EndsWith(t.hf_name, kLoraA)) continue;
    const std::string module = WithoutSuffix(t.hf_name, kLoraA);
    targets.insert(module.substr(module.rfind('.') + 1));
  }
  const auto list_or_null = [](const auto& v) { return v.empty() ? json(nullptr) : json(v); };
  const json init = lora.init_lora_weights == "true"    ? json(true)
                    : lora.init_lora_weights == "false" ? json(false)
                                                        : json(lora.init_lora_weights);
  json c = {{"task_type", "CAUSAL_LM"},
            {"peft_type", "LORA"},
            {"auto_mapping", nullptr},
            {"base_model_name_or_path", list_or_null(model.init_from)},
            {"revision", nullptr},
            {"inference_mode", true},
            {"r", lora.r},
            {"target_modules", json(std::vector<std::string>(targets.begin(), targets.end()))},
            {"exclude_modules", nullptr},
            {"lora_alpha", lora.lora_alpha},
            {"lora_dropout", lora.lora_dropout},
            // PEFT sets it for GPT-2's Conv1D linears, whose weights HF stores [in, out].
            {"fan_in_fan_out", model.type == "gpt2"},
            {"bias", lora.bias},
            {"use_rslora", lora.use_rslora},
            {"modules_to_save", list_or_null(lora.modules_to_save)},
            {"init_lora_weights", init},
            {"layers_to_transform", list_or_null(lora.layers_to_transform)},
            {"layers_pattern", nullptr},
            {"megatron_core", "megatron.core"}};
  for (const auto& [key, fallback] : DefaultOnlyKeys()) c[key] = fallback;
  if (lora.lora_alpha == static_cast<double>(static_cast<int64_t>(lora.lora_alpha))) {
    c["lora_alpha"] = static_cast<int64_t>(lora.lora_alpha);  // as PEFT writes an int
  }
  return c;
}

json ReadPeftConfig(const std::string& dir) {
  const std::string path = (fs::path(dir) / kPeftAdapterFiles.config).string();
  std::error_code ec;
  ZTRAIN_CHECK_T(ConfigError, fs::is_regular_file(path, ec), "lora.init_from '", dir,
                 "' has no adapter_config.json: not a PEFT adapter directory (PEFT's "
                 "save_pretrained, or ztrain export --format peft, writes one)");
  json c;
  try {
    c = detail::ParseJsonFile(path, "adapter_config.json");
  } catch (const IoError& e) {
    throw ConfigError(e.what());
  }
  const json type = c.value("peft_type", json("LORA"));
  ZTRAIN_CHECK_T(ConfigError, type == "LORA", path, ": peft_type ", type.dump(),
                 " is not LoRA; ztrain trains LoRA adapters");
  const json task = c.value("task_type", json(nullptr));
  ZTRAIN_CHECK_T(ConfigError, task.is_null() || task == "CAUSAL_LM", path, ": task_type ",
                 task.dump(), " is not CAUSAL_LM; ztrain trains causal language models");
  std::string refused;
  for (const auto& [key, fallback] : DefaultOnlyKeys()) {
    if (c.contains(key) && !IsDefault(c[key], fallback)) {
      refused += StrCat(refused.empty() ? "" : ", ", key, " ", c[key].dump());
    }
  }
  ZTRAIN_CHECK_T(ConfigError, refused.empty(), path, ": ", refused,
                 " is not run by ztrain (it trains plain LoRA: set these to PEFT's defaults)");
  json keys = json::object();
  for (const char* key : {"r", "lora_alpha", "lora_dropout", "target_modules", "bias", "use_rslora",
                          "modules_to_save", "layers_to_transform", "init_lora_weights"}) {
    if (c.contains(key) && !c[key].is_null()) keys[key] = c[key];
  }
  return keys;
}

void WritePeftAdapter(const std::string& dir, const ModelConfig& model, const LoraConfig& lora,
                      DType dtype, const std::function<const float*(const std::string&)>& value) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  ZTRAIN_CHECK_T(IoError, !ec && fs::is_directory(dir), "cannot create the adapter directory '",
                 dir, "': ", ec.message());
  const std::vector<HfTensor> layout = PeftLayout(model, lora);
  std::vector<std::vector<char>> bytes;
  bytes.reserve(layout.size());
  std::vector<SafetensorsTensor> tensors;
  for (const HfTensor& t : layout) {
    bytes.push_back(HfTensorBytes(t, value(t.param), dtype));
    tensors.push_back({t.hf_name, std::string(SafetensorsDTypeName(dtype)), t.hf_shape,
                       bytes.back().data(), static_cast<int64_t>(bytes.back().size())});
  }
  WriteSafetensors((fs::path(dir) / kPeftAdapterFiles.single).string(), tensors,
                   {{"format", "pt"}});
  detail::WriteJsonFile((fs::path(dir) / kPeftAdapterFiles.config).string(),
                        PeftConfigJson(lora, model));
}

}  // namespace ztrain::nn
