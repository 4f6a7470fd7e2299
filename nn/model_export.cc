#include "nn/model_export.h"

#include <map>

#include "nn/safetensors.h"

namespace ztrain::nn {
namespace {

// src is [rows, cols]; dst becomes [cols, rows].
void Transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

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

std::vector<HfGpt2Tensor> HfGpt2Layout(const ModelConfig& m) {
  const int64_t c = m.n_embd;
  std::vector<HfGpt2Tensor> out;
  auto plain = [&out](const std::string& name, const Shape& shape) {
    out.push_back({"transformer." + name, shape, name, shape, false});
  };
  // A Conv1D: weight [in, out] from ztrain's [out, in], and bias [out].
  auto conv1d = [&out](const std::string& name, int64_t in, int64_t n_out) {
    out.push_back(
        {"transformer." + name + ".weight", {in, n_out}, name + ".weight", {n_out, in}, true});
    out.push_back({"transformer." + name + ".bias", {n_out}, name + ".bias", {n_out}, false});
  };
  // Only the first vocab_size rows of the padded embedding: a prefix of its row-major data.
  out.push_back(
      {"transformer.wte.weight", {m.vocab_size, c}, "wte", {m.padded_vocab_size, c}, false});
  out.push_back({"transformer.wpe.weight", {m.max_seq_len, c}, "wpe", {m.max_seq_len, c}, false});
  for (int l = 0; l < m.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    plain(p + "ln_1.weight", {c});
    plain(p + "ln_1.bias", {c});
    conv1d(p + "attn.c_attn", c, 3 * c);
    conv1d(p + "attn.c_proj", c, c);
    plain(p + "ln_2.weight", {c});
    plain(p + "ln_2.bias", {c});
    conv1d(p + "mlp.c_fc", c, 4 * c);
    conv1d(p + "mlp.c_proj", 4 * c, c);
  }
  plain("ln_f.weight", {c});
  plain("ln_f.bias", {c});
  return out;
}

void SaveHfGpt2Safetensors(const std::string& path, const ModelConfig& model,
                           const ParamLookup& lookup, DType dtype) {
  ZTRAIN_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "cannot export '", path, "' as ",
               DTypeName(dtype), ": Hugging Face GPT-2 exports are fp32 or bf16");
  const std::vector<HfGpt2Tensor> layout = HfGpt2Layout(model);
  // Tensors exported unchanged point into the parameters; transposed or narrowed ones are
  // built here and must live until the file is written.
  std::vector<std::vector<float>> transposed;
  std::vector<std::vector<uint16_t>> narrowed;
  transposed.reserve(layout.size());
  narrowed.reserve(layout.size());
  std::vector<float> scratch;  // a bf16 export's transpose, before narrowing
  std::vector<SafetensorsTensor> tensors;
  for (const HfGpt2Tensor& t : layout) {
    const Tensor src = lookup(t.source);
    CheckTensor(src, DType::kF32, t.source_shape, t.source.c_str());
    const int64_t n = NumElements(t.shape);
    const float* values = src.data<float>();
    if (t.transposed) {
      std::vector<float>& dst = dtype == DType::kF32 ? transposed.emplace_back(n) : scratch;
      dst.resize(static_cast<size_t>(n));
      Transpose(values, t.source_shape[0], t.source_shape[1], dst.data());
      values = dst.data();
    }
    const void* data = values;
    if (dtype == DType::kBF16) {
      std::vector<uint16_t>& dst = narrowed.emplace_back(static_cast<size_t>(n));
      ConvertFromFloat(values, dst.data(), DType::kBF16, dst.size());
      data = dst.data();
    }
    tensors.push_back({t.hf_name, std::string(SafetensorsDTypeName(dtype)), t.shape, data,
                       n * static_cast<int64_t>(DTypeSize(dtype))});
  }
  WriteSafetensors(path, tensors, Metadata(model, dtype));
}

}  // namespace ztrain::nn
