// Reading a config file: I/O errors, JSON syntax errors with line:column, duplicate keys
// (DeepSpeed refuses them too), and the built-in default config.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/config.h"
#include "core/error.h"
#include "core/json_text.h"

namespace ztrain {
namespace {

using nlohmann::json;

// Parser callback that records keys repeated within one object, by JSON path.
class DuplicateKeyFinder {
 public:
  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        frames_.push_back(Frame{{}, FrameName(), event == json::parse_event_t::object_start});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames_.pop_back();
        break;
      case json::parse_event_t::key:
        key_ = parsed.get<std::string>();
        if (!frames_.back().keys.insert(key_).second) duplicates_.push_back(Path() + key_);
        break;
      case json::parse_event_t::value:
        break;
    }
    return true;
  }
  const std::vector<std::string>& duplicates() const { return duplicates_; }

 private:
  struct Frame {
    std::set<std::string> keys;
    std::string name;
    bool is_object;
  };
  std::string FrameName() const {
    if (frames_.empty()) return "";
    return frames_.back().is_object ? key_ : "[]";
  }
  std::string Path() const {
    std::string path;
    for (const Frame& f : frames_) {
      if (!f.name.empty()) path += f.name + ".";
    }
    return path;
  }
  std::vector<Frame> frames_;
  std::string key_;
  std::vector<std::string> duplicates_;
};

}  // namespace

nlohmann::json ReadConfigJson(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw ConfigError(detail::StrCat("config file ", path, ": is a directory; give the JSON "
                                     "config file, e.g. ", path, "/ds_config.json"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError(
        detail::StrCat("config file ", path, ": cannot open (", std::strerror(errno), ")"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  DuplicateKeyFinder finder;
  const json j = ParseJsonOrThrow<ConfigError>(text, "config file " + path, std::ref(finder));
  if (!finder.duplicates().empty()) {
    std::string msg = detail::StrCat("config file ", path, ": duplicate keys (", path,
                                     " would silently keep only the last):");
    for (const std::string& key : finder.duplicates()) msg += "\n  " + key;
    throw ConfigError(msg);
  }
  return j;
}

Config LoadConfigFile(const std::string& path, int world_size) {
  const json j = ReadConfigJson(path);
  try {
    return ParseConfig(j, world_size);
  } catch (const ConfigError& e) {
    throw ConfigError(detail::StrCat("config file ", path, ": ", e.what()));
  }
}

nlohmann::json DefaultConfigJson() {
  // Keep configs/default.json identical (ConfigFileTest.DefaultJsonMatchesBuiltIn).
  return json::parse(R"({
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 25,
  "gradient_clipping": 1.0,
  "optimizer": {
    "type": "AdamW",
    "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
  },
  "scheduler": {
    "type": "WarmupCosineLR",
    "params": {"warmup_num_steps": 20, "total_num_steps": 300, "warmup_type": "linear",
               "warmup_min_ratio": 0.0, "cos_min_ratio": 0.1}
  },
  "zero_optimization": {"stage": 0},
  "model": {"type": "gpt2", "n_layer": 4, "n_head": 4, "n_embd": 128, "vocab_size": 512,
            "padded_vocab_size": "auto", "max_seq_len": 64},
  "data": {"train": "", "val": "", "seq_len": "auto"},
  "training": {"steps": 300, "seed": 1337, "eval_interval": 100, "eval_batches": 8}
})");
}

}  // namespace ztrain
