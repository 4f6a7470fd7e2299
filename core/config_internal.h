#pragma once
// Internals of config parsing shared by core/config*.cc; not part of the public API.
//
// ParseConfig runs these passes over one JSON tree, each adding to the same ConfigErrors so
// that a user sees every problem at once:
//   BuildResolvedTree  unknown keys, types; a complete tree with every default filled in
//   ResolveDerived     "auto" and other values that depend on other keys
//   ResolveBatchSize   the batch triple, as DeepSpeed's _set_batch_related_parameters
//   CheckRefusals      DeepSpeed features ztrain does not run yet
//   CheckRanges        values the trainer cannot use (lr < 0, n_embd % n_head != 0, ...)
// A pass never sees a wrongly typed value: BuildResolvedTree replaces it by the default after
// recording the error, so later passes only add errors of their own.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"

namespace ztrain::detail {

// Problems found while parsing, each "json.path: what is wrong and how to fix it".
class ConfigErrors {
 public:
  void Add(std::string_view path, std::string_view message);
  bool empty() const { return lines_.empty(); }
  size_t size() const { return lines_.size(); }
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  std::vector<std::string> lines_;
};

// config_validate.cc
nlohmann::json BuildResolvedTree(const nlohmann::json& input, ConfigErrors& errors);
// Levenshtein distance, used to suggest the nearest known key.
size_t EditDistance(std::string_view a, std::string_view b);

// config_resolve.cc
// The most transformer blocks a model may have: bounds the block list that
// activation_checkpointing resolves to (Note [Activation checkpointing config]).
inline constexpr int64_t kMaxLayers = 65536;
void ResolveDerived(nlohmann::json& tree, std::vector<AutoChoice>& choices);
void ResolveBatchSize(nlohmann::json& tree, int world_size, ConfigErrors& errors);

// config_refusals.cc
void CheckRefusals(const nlohmann::json& tree, ConfigErrors& errors);

// config_ranges.cc
void CheckRanges(const nlohmann::json& tree, ConfigErrors& errors);

// config_lora.cc: `lora.enabled` from whether `input` has a `lora` section; the section's
// values the trainer cannot use; the parsed section.
void ResolveLora(const nlohmann::json& input, nlohmann::json& tree);
void CheckLora(const nlohmann::json& tree, ConfigErrors& errors);
LoraConfig LoraFrom(const nlohmann::json& lora);
// The `quantization` section: what the trainer cannot use; the parsed section.
void CheckQuantization(const nlohmann::json& tree, ConfigErrors& errors);
QuantizationConfig QuantizationFrom(const nlohmann::json& quantization);

// Helpers (config.cc).
// The value at dotted `path`; throws InternalError when it is missing (a schema bug).
const nlohmann::json& At(const nlohmann::json& tree, std::string_view path);
nlohmann::json& At(nlohmann::json& tree, std::string_view path);
// Null when any part of `path` is missing.
const nlohmann::json* Find(const nlohmann::json& tree, std::string_view path);
nlohmann::json* Find(nlohmann::json& tree, std::string_view path);
// An integer value as int64_t; unsigned values above INT64_MAX (JSON's 2^64 - 1) clamp to it.
int64_t ClampedInt(const nlohmann::json& v);
// A value as messages show it: strings unquoted when `quote` is false.
std::string ValueText(const nlohmann::json& v, bool quote = true);
bool EqualsIgnoreCase(std::string_view a, std::string_view b);

}  // namespace ztrain::detail
