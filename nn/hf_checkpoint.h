#pragma once
// Hugging Face model directories, in and out, for every family (its adapter: nn/hf_family.h).
//
// A directory as save_pretrained writes it: config.json, and either model.safetensors or
// shards model-0000k-of-0000N.safetensors named by model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {tensor: file}}). Tensors may be F32,
// BF16 or F16; ztrain widens them to fp32 as it reads.
//
// HfCheckpoint opens a directory and validates every header (nn/safetensors.h) and the
// index, without reading tensor data; Read then reads any element range of a tensor with
// positioned reads, so a rank reads only what it holds (Note [Reading only what a rank holds]
// in engine/engine_params.cc): a 70B checkpoint loads on ranks that each hold 1/N of it.
//
// HfModelWriter writes a directory from whole fp32 parameters given one at a time in any
// order, holding at most one shard's bytes: a shard is written (to a temporary, renamed into
// place: Note [atomic model files]) when its last tensor arrives. Shards are cut in layout
// order at `max_shard_bytes` (HF's save_pretrained default, 5 GB); one shard is
// model.safetensors without an index. Finish writes the index, config.json and
// generation_config.json, and removes older model*.safetensors files the new index does not
// name. Errors: IoError naming the file, ConfigError for a directory that is no HF model.
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "nn/hf_family.h"
#include "nn/safetensors.h"

namespace ztrain::nn {

namespace detail {
class InputFile;
}

inline constexpr int64_t kHfDefaultMaxShardBytes = 5'000'000'000;

// True when `path` is a directory holding a config.json.
bool IsHfModelDir(const std::string& path);
// True when an output path names a HF directory rather than one file: it ends in '/' or is
// an existing directory.
bool NamesHfModelDir(const std::string& path);

// config.json of `dir` (ConfigError when missing or not a JSON object).
nlohmann::json ReadHfConfig(const std::string& dir);

// The files of a directory: a model's (config.json, model.safetensors or its shards), or a
// PEFT adapter's (adapter_config.json, adapter_model.safetensors: nn/peft.h).
struct HfFiles {
  const char* config;
  const char* single;  // the weights in one file
  const char* index;   // the shards' index; nullptr: never sharded
};
inline constexpr HfFiles kHfModelFiles{"config.json", "model.safetensors",
                                       "model.safetensors.index.json"};
inline constexpr HfFiles kPeftAdapterFiles{"adapter_config.json", "adapter_model.safetensors",
                                           nullptr};

class HfCheckpoint {
 public:
  explicit HfCheckpoint(std::string dir, const HfFiles& files = kHfModelFiles);
  ~HfCheckpoint();
  HfCheckpoint(const HfCheckpoint&) = delete;
  HfCheckpoint& operator=(const HfCheckpoint&) = delete;

  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  // The config file's name: config.json, or a PEFT adapter's adapter_config.json.
  const char* config_name() const { return config_name_; }
  // What the directory is, for messages ("Hugging Face directory", "PEFT adapter directory").
  const char* kind() const { return kind_; }
  // The tensor's header entry, or nullptr.
  const SafetensorsEntry* Find(const std::string& name) const;
  // The file holding `name` (for messages).
  const std::string& FileOf(const std::string& name) const;
  std::vector<std::string> TensorNames() const;
  // Elements [begin, begin + count) of tensor `name`, row-major, widened to fp32.
  void Read(const std::string& name, int64_t begin, int64_t count, float* out) const;

 private:
  struct Where {
    size_t file;
    const SafetensorsEntry* entry;
  };
  const Where& Locate(const std::string& name) const;

  std::string dir_;
  const char* config_name_;
  const char* kind_;
  nlohmann::json config_;
  std::vector<std::string> files_;
  std::vector<SafetensorsHeader> headers_;
  std::vector<std::unique_ptr<detail::InputFile>> inputs_;
  std::map<std::string, Where> where_;
};

// Checks that `ckpt` holds every tensor of `layout` with its HF shape in F32/BF16/F16
// (IoError naming the tensor, the file and the fix otherwise) and returns the names of
// tensors it holds that are neither in the layout nor buffers of `family`.
std::vector<std::string> CheckHfTensors(const HfCheckpoint& ckpt,
                                        const std::vector<HfTensor>& layout,
                                        const HfFamily& family);

// Elements [begin, begin + count) of parameter `t.param` (row-major in t.param_shape) from
// `ckpt`: padding rows are zero, a transposed tensor is read column by column. Returns how
// many of them the file holds (the rest are padding).
int64_t ReadHfParameter(const HfCheckpoint& ckpt, const HfTensor& t, int64_t begin, int64_t count,
                     float* out);

// The HF tensor's bytes (`dtype`: kF32, kBF16 or kF16) from the whole fp32 parameter.
std::vector<char> HfTensorBytes(const HfTensor& t, const float* param, DType dtype);

class HfModelWriter {
 public:
  HfModelWriter(std::string dir, const ModelConfig& model, DType dtype,
                int64_t max_shard_bytes = kHfDefaultMaxShardBytes);
  ~HfModelWriter();
  HfModelWriter(const HfModelWriter&) = delete;
  HfModelWriter& operator=(const HfModelWriter&) = delete;

  // The whole fp32 value of parameter `param` (its shape as the layout gives it).
  void Add(const std::string& param, const float* values);
  // Every parameter was added: index, config.json, generation_config.json. Returns the
  // number of shard files.
  int Finish();

 private:
  void WriteShard(size_t shard);

  std::string dir_;
  ModelConfig model_;
  DType dtype_;
  const HfFamily* family_;
  std::vector<HfTensor> layout_;
  std::map<std::string, size_t> by_param_;
  std::vector<size_t> shard_of_;                 // per layout entry
  std::vector<std::vector<size_t>> shards_;      // layout entries per shard, in order
  std::vector<size_t> missing_;                  // per shard: tensors not yet added
  std::vector<std::vector<char>> bytes_;         // per layout entry, until its shard is written
  std::vector<bool> added_;                      // per layout entry
  std::vector<std::string> file_names_;
  int64_t total_bytes_ = 0;
};

// Copies the tokenizer and generation files of a HF directory (tokenizer.json,
// tokenizer_config.json, special_tokens_map.json, tokenizer.model, generation_config.json,
// vocab.json, merges.txt) into `to`, when `from` is one; returns how many were copied.
int CopyHfCompanionFiles(const std::string& from, const std::string& to);

}  // namespace ztrain::nn
