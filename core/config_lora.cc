// The `lora` section (PEFT's LoraConfig names): whether it is on, the values the trainer
// cannot use, and the parsed struct. What the adapters do is nn/adapters.h's.
#include <algorithm>
#include <cmath>
#include <regex>

#include "core/config_internal.h"

namespace ztrain::detail {
namespace {

using nlohmann::json;

// PEFT's other init_lora_weights values: initialisations from the base weights' decompositions
// or from data, which ztrain does not compute.
constexpr const char* kOtherPeftInits[] = {"pissa", "olora", "loftq", "eva", "corda", "orthogonal"};

void CheckLayers(const json& t, ConfigErrors& errors) {
  const json& layers = At(t, "lora.layers_to_transform");
  if (!layers.is_array()) return;
  const int64_t n_layer = ClampedInt(At(t, "model.n_layer"));
  std::vector<int64_t> seen;
  for (const json& l : layers) {
    const int64_t b = ClampedInt(l);
    if (b < 0 || b >= n_layer) {
      errors.Add("lora.layers_to_transform",
                 StrCat("block ", ValueText(l), " is out of range [0, model.n_layer = ", n_layer,
                        "); blocks count from 0"));
    } else if (std::find(seen.begin(), seen.end(), b) != seen.end()) {
      errors.Add("lora.layers_to_transform", StrCat("block ", b, " is listed twice"));
    }
    seen.push_back(b);
  }
  if (layers.empty()) {
    errors.Add("lora.layers_to_transform",
               "lists no block; give the blocks to adapt, or null for every block");
  }
}

void CheckTargets(const json& t, ConfigErrors& errors) {
  const json& targets = At(t, "lora.target_modules");
  if (targets.is_array()) {
    if (targets.empty()) {
      errors.Add("lora.target_modules",
                 "lists no module; name the linears to adapt (q_proj, v_proj, ...), "
                 "\"all-linear\", or null for the family's default");
    }
    for (const json& name : targets) {
      if (name.get<std::string>().empty()) {
        errors.Add("lora.target_modules", "an empty name matches nothing; remove it");
      }
    }
    return;
  }
  if (!targets.is_string() || targets == "all-linear") return;
  if (targets.get<std::string>().find_first_not_of(" \t") == std::string::npos) {
    errors.Add("lora.target_modules",
               "\"\" is an empty regular expression, which would adapt every module's name or "
               "none; name the linears to adapt ([\"q_proj\", \"v_proj\"], ...), \"all-linear\", "
               "or null for the family's default");
    return;
  }
  try {
    std::regex(targets.get<std::string>());
  } catch (const std::regex_error& e) {
    errors.Add("lora.target_modules",
               StrCat("\"", targets.get<std::string>(), "\" is not a regular expression (",
                      e.what(), "); give a list of names to match them by suffix"));
  }
}

void CheckInit(const json& t, ConfigErrors& errors) {
  const json& init = At(t, "lora.init_lora_weights");
  if (init.is_boolean() || init == "gaussian") return;
  const std::string v = init.get<std::string>();
  const bool peft = std::any_of(std::begin(kOtherPeftInits), std::end(kOtherPeftInits),
                                [&](const char* name) { return EqualsIgnoreCase(name, v); });
  errors.Add("lora.init_lora_weights",
             StrCat(peft ? "PEFT's \"" + v + "\" initialisation is not run by ztrain"
                         : "\"" + v + "\" is no initialisation",
                    "; use true (PEFT's default: A Kaiming-uniform, B zero), \"gaussian\" or "
                    "false"));
}

}  // namespace

// Note [LoRA config]: `enabled` null is true when the config has a `lora` section (any keys:
// PEFT's own configs have no `enabled`), so `"lora": {"r": 16}` turns LoRA on and a config
// without the section trains the whole model.
void ResolveLora(const json& input, json& tree) {
  json& enabled = At(tree, "lora.enabled");
  if (!enabled.is_null()) return;
  const json* section = Find(input, "lora");
  enabled = section != nullptr && section->is_object();
}

void CheckLora(const json& t, ConfigErrors& errors) {
  if (At(t, "lora.enabled") != true) return;
  const int64_t r = ClampedInt(At(t, "lora.r"));
  if (r < 1 || r > (int64_t{1} << 20)) {
    errors.Add("lora.r", StrCat("the adapters' rank must be in [1, 2^20], got ", r));
  }
  const double alpha = At(t, "lora.lora_alpha").get<double>();
  if (!(alpha > 0.0) || !std::isfinite(alpha)) {
    errors.Add("lora.lora_alpha",
               StrCat("must be a positive number (scaling = lora_alpha / r), got ", alpha));
  }
  const double dropout = At(t, "lora.lora_dropout").get<double>();
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    errors.Add("lora.lora_dropout", StrCat("must be in [0, 1), got ", dropout));
  }
  CheckLayers(t, errors);
  CheckTargets(t, errors);
  CheckInit(t, errors);
}

LoraConfig LoraFrom(const json& l) {
  LoraConfig c;
  c.enabled = l["enabled"] == true;
  c.r = static_cast<int>(l["r"].get<int64_t>());
  c.lora_alpha = l["lora_alpha"];
  c.lora_dropout = l["lora_dropout"];
  const json& targets = l["target_modules"];
  if (targets.is_string()) c.target_regex = targets.get<std::string>();
  if (targets.is_array()) c.target_modules = targets.get<std::vector<std::string>>();
  c.bias = l["bias"].get<std::string>();
  c.use_rslora = l["use_rslora"];
  if (l["modules_to_save"].is_array()) {
    c.modules_to_save = l["modules_to_save"].get<std::vector<std::string>>();
  }
  if (l["layers_to_transform"].is_array()) {
    c.layers_to_transform = l["layers_to_transform"].get<std::vector<int>>();
    std::sort(c.layers_to_transform.begin(), c.layers_to_transform.end());
  }
  const json& init = l["init_lora_weights"];
  c.init_lora_weights =
      init.is_boolean() ? (init == true ? "true" : "false") : init.get<std::string>();
  c.init_from = l["init_from"].get<std::string>();
  return c;
}

}  // namespace ztrain::detail

namespace ztrain {

double LoraConfig::scaling() const {
  return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(r))
                    : lora_alpha / static_cast<double>(r);
}

}  // namespace ztrain
