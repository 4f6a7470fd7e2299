#include "nn/family.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "nn/gpt2.h"
#include "nn/llama.h"

namespace ztrain::nn {
namespace {

// "1, 2, 3, 4, 6, 12": the tp sizes that split `n` evenly.
std::string Divisors(int64_t n) {
  std::string out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d != 0) continue;
    if (!out.empty()) out += ", ";
    out += std::to_string(d);
  }
  return out;
}

// The one place families are registered.
std::vector<ModelFamily> RegisterFamilies() { return {Gpt2Family(), LlamaFamily()}; }

}  // namespace

const std::vector<ModelFamily>& ModelFamilies() {
  static const std::vector<ModelFamily> families = RegisterFamilies();
  return families;
}

const ModelFamily& FindModelFamily(const std::string& type) {
  std::string known;
  for (const ModelFamily& f : ModelFamilies()) {
    if (f.type == type) return f;
    known += (known.empty() ? "\"" : ", \"") + f.type + "\"";
  }
  ZTRAIN_CHECK_T(ConfigError, false, "model.type '", type, "' is not known; use one of ", known);
  throw InternalError("unreachable");
}

const ModelFamily& FindHfFamily(const nlohmann::json& hf, const std::string& path) {
  const auto listed = [](const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  std::vector<std::string> architectures;
  if (hf.contains("architectures") && hf["architectures"].is_array()) {
    for (const nlohmann::json& a : hf["architectures"]) {
      if (a.is_string()) architectures.push_back(a.get<std::string>());
    }
  }
  const std::string model_type = hf.value("model_type", std::string());
  std::string known;
  for (const ModelFamily& f : ModelFamilies()) {
    for (const std::string& a : architectures) {
      if (listed(f.hf.architectures, a)) return f;
    }
    if (architectures.empty() && listed(f.hf.model_types, model_type)) return f;
    for (const std::string& a : f.hf.architectures) known += (known.empty() ? "" : ", ") + a;
  }
  std::string says;
  for (const std::string& a : architectures) says += (says.empty() ? "" : ", ") + a;
  ZTRAIN_CHECK_T(ConfigError, false, path, ": architectures [", says, "], model_type '",
                 model_type, "' is no family ztrain trains; it reads ", known);
  throw InternalError("unreachable");
}

void CheckModel(const ModelConfig& model) {
  std::string message;
  for (const std::string& p : FindModelFamily(model.type).config_problems(model)) {
    message += (message.empty() ? "" : "\n") + p;
  }
  ZTRAIN_CHECK_T(ConfigError, message.empty(), message);
}

LayerList BuildModel(const ModelConfig& model, std::shared_ptr<const LinearProvider> provider,
                     const AdapterPlan& plan) {
  const ModelFamily& family = FindModelFamily(model.type);
  CheckModel(model);
  if (provider->size() > 1) CheckTensorParallelModel(model, provider->size());
  LayerList layers = family.build(model, std::move(provider));
  if (!plan.enabled()) return layers;
  for (const std::unique_ptr<Layer>& layer : layers) layer->Adapt(plan);
  plan.CheckAllMatched();
  return layers;
}

std::string DivisibilityProblem(const char* key, int64_t value, int tp, const std::string& fix) {
  if (tp > 0 && value % tp == 0) return "";
  return ztrain::detail::StrCat(key, " ", value, " does not divide by tensor_parallel.size ", tp, "; ",
                        fix);
}

std::string HeadSplitProblem(const char* key, int64_t heads, int tp) {
  return DivisibilityProblem(key, heads, tp,
                             "use a tensor_parallel.size that divides it (" +
                                 (heads > 0 ? Divisors(heads) : std::string("none")) +
                                 "): each rank runs " + key + " / size whole attention heads");
}

void CheckTensorParallelModel(const ModelConfig& m, int tp_size) {
  ZTRAIN_CHECK_T(ConfigError, tp_size >= 1, "tensor_parallel.size ", tp_size,
                 " must be at least 1");
  std::vector<std::string> problems = FindModelFamily(m.type).tp_problems(m, tp_size);
  // The smallest padded size >= vocab_size that the group splits into whole 128-row slices
  // (the GPU-friendly padding "auto" uses), as a suggestion.
  const int64_t step = std::lcm<int64_t>(128, tp_size);
  const int64_t suggested = (m.vocab_size + step - 1) / step * step;
  problems.push_back(DivisibilityProblem(
      "model.padded_vocab_size", m.padded_vocab_size, tp_size,
      "set model.padded_vocab_size to a multiple of the size that is at least "
      "model.vocab_size, e.g. " +
          std::to_string(suggested) + ": each rank holds padded_vocab_size / size embedding rows"));
  std::string message;
  for (const std::string& p : problems) {
    if (!p.empty()) message += (message.empty() ? "" : "\n") + p;
  }
  ZTRAIN_CHECK_T(ConfigError, message.empty(), message);
}

}  // namespace ztrain::nn
