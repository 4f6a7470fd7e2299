// Pass 1 of ParseConfig: checks every key and type of the user's JSON against the schema
// and builds the complete tree with every default filled in (core/config_internal.h).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <utility>

#include "core/config_internal.h"
#include "core/config_schema.h"
#include "core/error.h"

namespace ztrain::detail {
namespace {

using nlohmann::json;

// What the walk needs to know before it reaches optimizer.params / scheduler.params.
struct WalkContext {
  bool optimizer_supported = true;
  bool scheduler_given = false;
  bool scheduler_supported = false;
  std::string scheduler_type;
};

WalkContext ContextOf(const json& input) {
  WalkContext ctx;
  const json* opt = Find(input, "optimizer.type");
  if (opt && opt->is_string()) {
    const auto& types = SupportedOptimizerTypes();
    ctx.optimizer_supported = std::any_of(types.begin(), types.end(), [&](const auto& t) {
      return EqualsIgnoreCase(t, opt->get<std::string>());
    });
  }
  const json* sched = Find(input, "scheduler.type");
  if (sched && sched->is_string()) {
    ctx.scheduler_given = true;
    ctx.scheduler_type = sched->get<std::string>();
    const auto& types = SupportedSchedulerTypes();
    ctx.scheduler_supported =
        std::find(types.begin(), types.end(), ctx.scheduler_type) != types.end();
  }
  return ctx;
}

std::string_view Leaf(std::string_view path) {
  const size_t dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

std::string Join(std::string_view section, std::string_view key) {
  return section.empty() ? std::string(key) : std::string(section) + "." + std::string(key);
}

bool Applies(const ConfigKey& key, const WalkContext& ctx) {
  if (key.only_for.empty()) return true;
  return std::find(key.only_for.begin(), key.only_for.end(), ctx.scheduler_type) !=
         key.only_for.end();
}

std::string Describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean " + v.dump();
    case json::value_t::string:
      return "string " + v.dump();
    case json::value_t::array:
      return "array " + v.dump();
    case json::value_t::object:
      return "object";
    default:
      return "number " + v.dump();
  }
}

std::string Expected(const ConfigKey& key) {
  std::string s(ConfigTypeName(key.type));
  if (key.nullable) s += " or null";
  if (key.auto_ok) s += " or \"auto\"";
  return s;
}

// An integer, or an integral float as an integer (DeepSpeed accepts 5e8); nullopt otherwise.
std::optional<json> AsInteger(const json& v) {
  if (v.is_number_integer()) return v;
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) {
      return json(static_cast<int64_t>(d));
    }
  }
  return std::nullopt;
}

// An array of integers as AsInteger takes each; nullopt otherwise.
std::optional<json> AsIntegerList(const json& v) {
  if (!v.is_array()) return std::nullopt;
  json out = json::array();
  for (const json& e : v) {
    auto i = AsInteger(e);
    if (!i) return std::nullopt;
    out.push_back(*i);
  }
  return out;
}

// data.train as a list: each entry {"path": non-empty string, "weight": number > 0 (default
// 1)} and nothing else; normalised to both keys. Every problem is recorded.
std::optional<json> DataSources(const ConfigKey& key, const json& v, ConfigErrors& errors) {
  json out = json::array();
  bool ok = !v.empty();
  if (v.empty()) errors.Add(key.path, "an empty list names no data; give one glob or datasets");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = key.path + "[" + std::to_string(i) + "]";
    const json& e = v[i];
    if (!e.is_object()) {
      errors.Add(at, "expected {\"path\": glob, \"weight\": number}, got " + Describe(e));
      ok = false;
      continue;
    }
    for (const auto& [k, value] : e.items()) {
      if (k != "path" && k != "weight") {
        errors.Add(at + "." + k, "unknown key (a dataset has \"path\" and \"weight\")");
        ok = false;
      }
    }
    const json path = e.value("path", json());
    const json weight = e.value("weight", json(1.0));
    if (!path.is_string() || path.get<std::string>().empty()) {
      errors.Add(at + ".path", "expected a glob of token shards, got " + Describe(path));
      ok = false;
    }
    if (!weight.is_number() || !(weight.get<double>() > 0) || !std::isfinite(weight.get<double>())) {
      errors.Add(at + ".weight", "expected a number > 0, got " + Describe(weight));
      ok = false;
    }
    if (ok) out.push_back({{"path", path}, {"weight", weight.get<double>()}});
  }
  if (!ok) return std::nullopt;
  return out;
}

// One optimizer.param_groups entry normalised to all five keys (core/config.h
// ParamGroupRule), or nullopt after recording what is wrong with it.
std::optional<json> ParamGroup(const std::string& at, const json& e, size_t index,
                               ConfigErrors& errors) {
  if (!e.is_object()) {
    errors.Add(at,
               "expected {\"name\", \"params\": [globs], \"ndim\", \"weight_decay\", "
               "\"lr_scale\"}, got " +
                   Describe(e));
    return std::nullopt;
  }
  const size_t before = errors.size();
  for (const auto& [k, value] : e.items()) {
    if (k != "name" && k != "params" && k != "ndim" && k != "weight_decay" && k != "lr_scale") {
      errors.Add(at + "." + k,
                 "unknown key (a parameter group has \"name\", \"params\", "
                 "\"ndim\", \"weight_decay\" and \"lr_scale\")");
    }
  }
  const json name = e.value("name", json("group" + std::to_string(index)));
  if (!name.is_string() || name.get<std::string>().empty()) {
    errors.Add(at + ".name", "expected a non-empty string, got " + Describe(name));
  } else if (name == "default" || name == "frozen") {
    errors.Add(at + ".name", name.dump() +
                                 " names the group of the parameters no rule matches, or the "
                                 "frozen ones; choose another name");
  }
  json params = e.value("params", json::array());
  if (params.is_string()) params = json::array({params});
  bool globs_ok = params.is_array();
  for (const json& p : params)
    globs_ok = globs_ok && p.is_string() && !p.get<std::string>().empty();
  if (!globs_ok) {
    errors.Add(at + ".params",
               "expected a glob or an array of globs over parameter names "
               "(\"*.bias\", \"layers.*.mlp.*\"), got " +
                   Describe(params));
  }
  const json ndim = e.value("ndim", json(0));
  const auto ndim_int = AsInteger(ndim);
  if (!ndim_int || ndim_int->get<int64_t>() < 0) {
    errors.Add(at + ".ndim",
               "expected an integer >= 1 (the parameters' number of dimensions), "
               "got " +
                   Describe(ndim));
  }
  if (globs_ok && params.empty() && ndim_int && ndim_int->get<int64_t>() == 0) {
    errors.Add(at,
               "matches nothing: give \"params\" (globs over parameter names), \"ndim\", or "
               "both");
  }
  const json decay = e.value("weight_decay", json());
  if (!decay.is_null() &&
      !(decay.is_number() && decay.get<double>() >= 0 && std::isfinite(decay.get<double>()))) {
    errors.Add(at + ".weight_decay",
               "expected a number >= 0 (or leave it out for "
               "optimizer.params.weight_decay), got " +
                   Describe(decay));
  }
  const json scale = e.value("lr_scale", json(1.0));
  if (!(scale.is_number() && scale.get<double>() >= 0 && std::isfinite(scale.get<double>()))) {
    errors.Add(at + ".lr_scale",
               "expected a number >= 0 (the group's learning rate is the "
               "scheduler's times this), got " +
                   Describe(scale));
  }
  if (errors.size() != before) return std::nullopt;
  return json{{"name", name},
              {"params", params},
              {"ndim", *ndim_int},
              {"weight_decay", decay},
              {"lr_scale", scale.get<double>()}};
}

std::optional<json> ParamGroups(const ConfigKey& key, const json& v, ConfigErrors& errors) {
  json out = json::array();
  bool ok = true;
  std::vector<json> names;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = key.path + "[" + std::to_string(i) + "]";
    const json name = v[i].is_object() ? v[i].value("name", json()) : json();
    if (name.is_string() && std::find(names.begin(), names.end(), name) != names.end()) {
      errors.Add(at + ".name",
                 name.dump() + " names an earlier group too; give each group its own");
      ok = false;
    }
    names.push_back(name);
    std::optional<json> group = ParamGroup(at, v[i], i, errors);
    if (group) out.push_back(std::move(*group));
    ok = ok && group.has_value();
  }
  if (!ok) return std::nullopt;
  return out;
}

// The value normalised to the key's type, or nullopt after recording why it is wrong.
std::optional<json> Normalise(const ConfigKey& key, const json& v, ConfigErrors& errors) {
  if (v.is_null() && key.nullable) return v;
  if (v == "auto" && key.auto_ok) return v;
  switch (key.type) {
    case ConfigType::kBool:
      if (v.is_boolean()) return v;
      break;
    case ConfigType::kInt:
      if (auto i = AsInteger(v)) return i;
      break;
    case ConfigType::kNumber:
      if (v.is_number()) return v;
      break;
    case ConfigType::kString:
      if (!v.is_string()) break;
      if (key.choices.empty()) return v;
      for (const std::string& c : key.choices) {
        if (EqualsIgnoreCase(c, v.get<std::string>())) return json(c);
      }
      {
        std::string list;
        for (const std::string& c : key.choices) list += (list.empty() ? "\"" : ", \"") + c + "\"";
        errors.Add(key.path, "expected one of " + list + ", got " + v.dump());
      }
      return std::nullopt;
    case ConfigType::kStringList:
      if (v.is_array() &&
          std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_string(); })) {
        return v;
      }
      break;
    case ConfigType::kIntList:
      if (auto list = AsIntegerList(v)) return list;
      break;
    case ConfigType::kNumberPair:
      if (v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number()) return v;
      break;
    case ConfigType::kStringOrList:
      if (v.is_string()) return v;
      if (v.is_array() &&
          std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_string(); })) {
        return v;
      }
      break;
    case ConfigType::kIntOrList:
      if (auto i = AsInteger(v)) return json::array({*i});
      if (auto list = AsIntegerList(v)) return list;
      break;
    case ConfigType::kBoolOrString:
      if (v.is_boolean() || v.is_string()) return v;
      break;
    case ConfigType::kDataSources:
      if (v.is_string()) return v;
      if (v.is_array()) return DataSources(key, v, errors);
      break;
    case ConfigType::kParamGroups:
      if (v.is_array()) return ParamGroups(key, v, errors);
      break;
    case ConfigType::kSection:
    case ConfigType::kFreeObject:
      if (v.is_object()) return v;
      break;
  }
  std::string msg = "expected " + Expected(key) + ", got " + Describe(v);
  if (v == "auto") msg = "expected " + Expected(key) + "; \"auto\" is not accepted here";
  errors.Add(key.path, msg);
  return std::nullopt;
}

// DeepSpeed's deprecated spellings, answered with the current key.
const std::vector<std::pair<std::string, std::string>>& RenamedKeys() {
  static const std::vector<std::pair<std::string, std::string>> renamed = {
      {"zero_optimization.cpu_offload", "zero_optimization.offload_optimizer"},
      {"zero_optimization.cpu_offload_param", "zero_optimization.offload_param"},
      {"zero_optimization.cpu_offload_use_pin_memory",
       "zero_optimization.offload_optimizer.pin_memory"},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save",
       "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
  };
  return renamed;
}

std::string Suggestion(const std::string& path, std::string_view name,
                       const std::vector<const ConfigKey*>& siblings) {
  for (const auto& [old_path, new_path] : RenamedKeys()) {
    if (old_path == path) return "; DeepSpeed deprecated it, use \"" + new_path + "\"";
  }
  const ConfigKey* best = nullptr;
  size_t best_distance = 0;
  for (const ConfigKey* k : siblings) {
    const size_t d = EditDistance(name, Leaf(k->path));
    if (!best || d < best_distance) {
      best = k;
      best_distance = d;
    }
  }
  if (best && best_distance <= std::max<size_t>(2, name.size() / 3)) {
    return "; did you mean \"" + best->path + "\"?";
  }
  for (const ConfigKey& k : ConfigSchema::Get().keys()) {
    if (Leaf(k.path) == name) return "; did you mean \"" + k.path + "\" (another section)?";
  }
  if (!siblings.empty() && siblings.size() <= 12) {
    std::string list;
    for (const ConfigKey* k : siblings)
      list += (list.empty() ? "" : ", ") + std::string(Leaf(k->path));
    return "; known keys here: " + list;
  }
  return "";
}

void ReportUnknown(const std::string& path, std::string_view name,
                   const std::vector<const ConfigKey*>& siblings, const WalkContext& ctx,
                   ConfigErrors& errors) {
  const ConfigKey* elsewhere = ConfigSchema::Get().Find(path);
  if (elsewhere && !Applies(*elsewhere, ctx)) {
    std::string owners;
    for (const std::string& t : elsewhere->only_for) owners += (owners.empty() ? "" : ", ") + t;
    errors.Add(path, "not a parameter of scheduler type " + ctx.scheduler_type +
                         "; it belongs to " + owners);
    return;
  }
  errors.Add(path, "unknown key" + Suggestion(path, name, siblings));
}

json FillSection(const std::string& path, const json* given, const WalkContext& ctx,
                 ConfigErrors& errors);

json FillKey(const ConfigKey& key, const json* given, const WalkContext& ctx,
             ConfigErrors& errors) {
  std::optional<json> value;
  if (given && !(key.type == ConfigType::kSection && given->is_null())) {
    value = Normalise(key, *given, errors);
  }
  if (key.type != ConfigType::kSection) return value ? *value : key.default_value;
  const json* section = value ? &*value : nullptr;
  if (key.path == "optimizer.params" && !ctx.optimizer_supported) {
    return section ? *section : json::object();  // refused with optimizer.type
  }
  if (key.path == "scheduler.params" && !ctx.scheduler_supported) {
    if (!ctx.scheduler_given && section && !section->empty()) {
      errors.Add(key.path,
                 "parameters without scheduler.type; set scheduler.type to one of "
                 "WarmupLR, WarmupDecayLR, WarmupCosineLR or drop them");
    }
    return ctx.scheduler_given && section ? *section : json::object();
  }
  return FillSection(key.path, section, ctx, errors);
}

json FillSection(const std::string& path, const json* given, const WalkContext& ctx,
                 ConfigErrors& errors) {
  json out = json::object();
  std::vector<const ConfigKey*> known;
  for (const ConfigKey* key : ConfigSchema::Get().Children(path)) {
    if (!Applies(*key, ctx)) continue;
    known.push_back(key);
    const std::string name(Leaf(key->path));
    const json* v = given && given->contains(name) ? &(*given)[name] : nullptr;
    out[name] = FillKey(*key, v, ctx, errors);
  }
  if (!given) return out;
  for (const auto& [name, v] : given->items()) {
    if (!out.contains(name)) ReportUnknown(Join(path, name), name, known, ctx, errors);
  }
  return out;
}

// DeepSpeed still reads a section under its older name when the current one is absent
// (get_bfloat16_config in deepspeed/runtime/precision_config.py reads "bfloat16" without
// "bf16"); the resolved tree has only the current name. Both given is an error: DeepSpeed
// would silently drop the older one.
json WithCurrentSectionNames(const json& input, ConfigErrors& errors) {
  static const std::pair<const char*, const char*> kOlderNames[] = {{"bfloat16", "bf16"}};
  json out = input;
  for (const auto& [older, current] : kOlderNames) {
    if (!out.contains(older)) continue;
    if (out.contains(current)) {
      errors.Add(older, StrCat("\"", current, "\" and its older name \"", older,
                               "\" are both given; keep only \"", current, "\""));
    } else {
      out[current] = out[older];
    }
    out.erase(older);
  }
  return out;
}

}  // namespace

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = diagonal + (std::tolower(static_cast<unsigned char>(a[i - 1])) !=
                                            std::tolower(static_cast<unsigned char>(b[j - 1])));
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

json BuildResolvedTree(const json& input, ConfigErrors& errors) {
  if (!input.is_object()) {
    errors.Add("(top level)", "a config is a JSON object { ... }, got " + Describe(input));
    return FillSection("", nullptr, WalkContext{}, errors);
  }
  const json named = WithCurrentSectionNames(input, errors);
  return FillSection("", &named, ContextOf(named), errors);
}

}  // namespace ztrain::detail
