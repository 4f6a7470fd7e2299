#include "nn/model_export.h"

#include <map>

#include "nn/gpt2.h"
#include "nn/hf_checkpoint.h"
#include "nn/safetensors.h"

namespace ztrain::nn {
namespace {

std::map<std::string, std::string> Metadata(const ModelConfig& m, DType dtype) {
  return {{"format", "pt"},
          {"ztrain_model", "gpt2"},
          {"ztrain_dtype", std::string(DTypeName(dtype))},
          {"ztrain_n_layer", std::to_string(m.n_layer)},
          {"ztrain_n_head", std::to_string(m.n_head)},
          {"ztrain_n_embd", std::to_string(m.n_embd)},
          {"ztrain_vocab_size", std::to_string(m.vocab_size)},
          {"ztrain_padded_vocab_size", std::to_string(m.padded_vocab_size)},
          {"ztrain_max_seq_len", std::to_string(m.max_seq_len)}};
}

}  // namespace

void SaveHfGpt2Safetensors(const std::string& path, const ModelConfig& model,
                           const ParamLookup& lookup, DType dtype) {
  ZTRAIN_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "cannot export '", path, "' as ",
               DTypeName(dtype), ": Hugging Face GPT-2 exports are fp32 or bf16");
  const std::vector<HfTensor> layout = HfGpt2Layout(model);
  std::vector<std::vector<char>> bytes;  // live until the file is written
  bytes.reserve(layout.size());
  std::vector<SafetensorsTensor> tensors;
  for (const HfTensor& t : layout) {
    const Tensor src = lookup(t.param);
    CheckTensor(src, DType::kF32, t.param_shape, t.param.c_str());
    const std::vector<char>& b = bytes.emplace_back(HfTensorBytes(t, src.data<float>(), dtype));
    tensors.push_back({t.hf_name, std::string(SafetensorsDTypeName(dtype)), t.hf_shape, b.data(),
                       static_cast<int64_t>(b.size())});
  }
  WriteSafetensors(path, tensors, Metadata(model, dtype));
}

}  // namespace ztrain::nn
