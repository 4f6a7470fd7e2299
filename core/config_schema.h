#pragma once
// The config schema: every key ztrain accepts, with its type, default and meaning, and the
// table of DeepSpeed features that parse but are refused until ztrain runs them.
//
// Both tables are immutable data built on first use (thread-safe static initialisation) and
// are the single source for parsing (core/config_validate.cc), refusal (config_refusals.cc)
// and the generated reference docs/config.md (ConfigReferenceMarkdown). Adding a key or
// lifting a refusal is a one-line change here; nothing else needs to know.
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ztrain {

enum class ConfigType {
  kBool,
  kInt,  // a JSON integer, or a float with an integral value (DeepSpeed accepts 5e8)
  kNumber,
  kString,
  kStringList,  // array of strings
  kIntList,     // array of integers (integral floats accepted, as for kInt)
  kNumberPair,  // array of exactly two numbers (Adam betas)
  // PEFT's unions: a string or an array of strings (kept as given); an integer or an array of
  // integers (resolved to an array); a boolean or a string (kept as given).
  kStringOrList,
  kIntOrList,
  kBoolOrString,
  // data.train: a glob, or an array of {"path": glob, "weight": number > 0} (weight defaults
  // to 1; resolved to both keys).
  kDataSources,
  // optimizer.param_groups: an array of {"name", "params", "ndim", "weight_decay", "lr_scale"}
  // objects (core/config.h ParamGroupRule; resolved to all five keys).
  kParamGroups,
  kSection,     // object whose keys are themselves in the schema
  kFreeObject,  // object with DeepSpeed-defined free-form content (checked only for refusals)
};

// Name of a type as error messages and the reference spell it ("integer", "object", ...).
std::string_view ConfigTypeName(ConfigType type);

// One key of the schema. `path` is the dotted JSON path ("zero_optimization.stage").
struct ConfigKey {
  std::string path;
  ConfigType type = ConfigType::kSection;
  nlohmann::json default_value;  // null = no default (the key resolves to null or is required)
  std::string doc;
  bool nullable = false;              // null is a valid value
  bool auto_ok = false;               // "auto" is accepted and resolved (config_resolve.cc)
  std::vector<std::string> choices;   // allowed strings, matched case-insensitively
  std::vector<std::string> only_for;  // scheduler.params.*: the scheduler types it belongs to

  ConfigKey Nullable() const;
  ConfigKey Auto() const;
  ConfigKey Choices(std::vector<std::string> values) const;
  ConfigKey OnlyFor(std::vector<std::string> types) const;
};

// The immutable table of all keys, in reference order.
class ConfigSchema {
 public:
  static const ConfigSchema& Get();

  const std::vector<ConfigKey>& keys() const { return keys_; }
  // The key at `path`, or nullptr.
  const ConfigKey* Find(std::string_view path) const;
  // Keys directly under section `path` ("" = top level), in table order.
  std::vector<const ConfigKey*> Children(std::string_view path) const;

 private:
  explicit ConfigSchema(std::vector<ConfigKey> keys);
  std::vector<ConfigKey> keys_;
};

// The optimizer and scheduler types ztrain runs (DeepSpeed spelling).
const std::vector<std::string>& SupportedOptimizerTypes();
const std::vector<std::string>& SupportedSchedulerTypes();

// A DeepSpeed setting that parses but asks for a feature ztrain does not run yet. Later
// issues delete entries from ConfigRefusals() as the features land.
struct ConfigRefusal {
  std::string path;  // key looked at in the resolved config
  std::string when;  // the refused values, for the reference ("true", "> 0", ...)
  std::string why;   // message; "{}" is replaced by the offending value
  // Returns the path (relative to `path`, "" = the key itself) of the offending setting, or
  // nullopt when the value is fine.
  std::function<std::optional<std::string>(const nlohmann::json& value)> refuses;
};
const std::vector<ConfigRefusal>& ConfigRefusals();

// The config reference (docs/config.md) generated from the two tables above.
std::string ConfigReferenceMarkdown();

namespace detail {
// A key with no flags; ConfigKey's modifiers add them.
ConfigKey Key(std::string path, ConfigType type, nlohmann::json def, std::string doc);
// Schema table parts, concatenated by ConfigSchema::Get().
std::vector<ConfigKey> DeepSpeedCoreKeys();   // config_schema_deepspeed.cc
std::vector<ConfigKey> DeepSpeedOtherKeys();  // config_schema_sections.cc
std::vector<ConfigKey> ZtrainKeys();          // config_schema.cc
}  // namespace detail

}  // namespace ztrain
