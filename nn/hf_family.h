#pragma once
// A family's adapter to Hugging Face model directories (torchtitan's state-dict adapter):
// how its config.json reads into ztrain's model keys and back, and which safetensors tensor
// each ztrain parameter is. Each family fills one in (ModelFamily::hf); the reader and writer
// of HF directories (nn/hf_checkpoint.h) are the same for every family.
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/tensor.h"

namespace ztrain::nn {

// One tensor of a HF checkpoint and the ztrain parameter it holds. hf_shape equals
// param_shape, or is its reverse when `transposed` (GPT-2's Conv1D weights are [in, out]),
// or has fewer rows (the vocabulary's padding rows are not in HF files: zero on load, dropped
// on save).
struct HfTensor {
  std::string hf_name;
  Shape hf_shape;
  std::string param;
  Shape param_shape;
  bool transposed = false;
};

struct HfFamily {
  // config.json's "architectures" entries and "model_type" values this family reads.
  std::vector<std::string> architectures;
  std::vector<std::string> model_types;
  // config.json (`hf`, read from `path`) as ztrain model keys ({"type": ..., "n_layer": ...}),
  // with a note per key that needed one ("max_seq_len": "sliding_window 4096"). ConfigError
  // naming the HF key and the fix for what the family cannot run.
  std::function<nlohmann::json(const nlohmann::json& hf, const std::string& path,
                               nlohmann::json* notes)>
      read_config;
  // The config.json that reads back as `model`, tensors stored as `dtype`.
  std::function<nlohmann::json(const ModelConfig& model, DType dtype)> write_config;
  // Every parameter of the model as its HF tensor, in the order HF's state_dict lists them.
  std::function<std::vector<HfTensor>(const ModelConfig& model)> layout;
  // Tensors a HF file may hold that are not parameters (buffers such as GPT-2's attn.bias
  // causal mask): name suffixes skipped without a word.
  std::vector<std::string> buffers;
  // config.json's name of each ztrain model key read_config takes from one HF key
  // ({"n_head", "num_attention_heads"}), so a problem with its value names the user's file
  // and key, not ztrain's (run/run_config.cc).
  std::vector<std::pair<std::string, std::string>> config_keys;
};

// config.json's torch_dtype for tensors stored as `dtype`: "float32", "bfloat16", "float16".
std::string HfTorchDType(DType dtype);

// config.json's value of `key` as an integer, number or bool; ConfigError naming the key and
// the file when it is missing (without a fallback) or of another type. A JSON null counts as
// missing, as transformers treats it.
int64_t HfInt(const nlohmann::json& hf, const char* key, const std::string& path);
int64_t HfInt(const nlohmann::json& hf, const char* key, const std::string& path,
              int64_t fallback);
double HfNumber(const nlohmann::json& hf, const char* key, const std::string& path,
                double fallback);
bool HfBool(const nlohmann::json& hf, const char* key, const std::string& path, bool fallback);
std::string HfString(const nlohmann::json& hf, const char* key, const std::string& path,
                     const std::string& fallback);

}  // namespace ztrain::nn
