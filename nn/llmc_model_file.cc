#include "nn/llmc_model_file.h"

#include <string>
#include <string_view>
#include <vector>

#include "core/sizes.h"
#include "nn/gpt2.h"
#include "nn/model_file_util.h"

namespace ztrain::nn {
namespace {

constexpr int64_t kHeaderBytes = 256 * sizeof(int32_t);

struct LlmcHeader {
  ModelConfig model;
  DType dtype = DType::kF32;
};

// The header's sizes must describe a model (Note [Size limits]) whose parameters fill the rest
// of the file exactly: a truncated or padded file is named before anything is read into a
// model (and before a run trains).
void CheckFileSize(const LlmcHeader& h, const detail::InputFile& f) {
  const ModelConfig& m = h.model;
  const bool plausible = m.n_layer >= 1 && m.n_layer <= 65536 && m.n_head >= 1 &&
                         m.n_embd >= 1 && m.n_embd % m.n_head == 0 && m.vocab_size >= 1 &&
                         m.padded_vocab_size >= m.vocab_size && m.max_seq_len >= 1 &&
                         SizeProduct({12, m.n_layer, m.n_embd, m.n_embd}).has_value() &&
                         SizeProduct({m.padded_vocab_size, m.n_embd}).has_value() &&
                         SizeProduct({m.max_seq_len, m.n_embd}).has_value();
  ZTRAIN_CHECK_T(IoError, plausible, "model file '", f.path(), "' has a header of no GPT-2 (",
                 m.n_layer, " layers, ", m.n_head, " heads, width ", m.n_embd, ", vocabulary ",
                 m.vocab_size, " padded to ", m.padded_vocab_size, ", context ", m.max_seq_len,
                 "): it is corrupt or not an llm.c model file");
  int64_t elements = 0;
  for (const auto& layer : BuildGpt2(m)) {
    for (const ParamSpec& p : layer->Params()) {
      if (p.tied_to.empty()) elements += NumElements(p.shape);
    }
  }
  const int64_t expected = kHeaderBytes + elements * static_cast<int64_t>(DTypeSize(h.dtype));
  ZTRAIN_CHECK_T(IoError, f.size() == expected, "model file '", f.path(), "' is ", f.size(),
                 " bytes but its header describes ", expected, " (", elements, " ",
                 DTypeName(h.dtype), " parameters): ",
                 f.size() < expected ? "it is truncated" : "it is longer than its model",
                 "; copy it again or re-export it");
}

LlmcHeader ReadHeader(const detail::InputFile& f) {
  int32_t header[256];
  ZTRAIN_CHECK_T(IoError, f.ReadAt(0, header, sizeof header), "model file '", f.path(),
                 "' is shorter than its 1024-byte header");
  ZTRAIN_CHECK_T(IoError, header[0] == kLlmcModelMagic, "'", f.path(),
                 "' is not an llm.c model file (magic ", header[0], ", expected ", kLlmcModelMagic,
                 ")");
  ZTRAIN_CHECK_T(IoError, header[1] == kLlmcModelVersion || header[1] == kLlmcModelVersionBf16,
                 "model file '", f.path(), "' has version ", header[1], "; only version ",
                 kLlmcModelVersion, " (fp32) and ", kLlmcModelVersionBf16, " (bf16) are supported");
  LlmcHeader h;
  h.dtype = header[1] == kLlmcModelVersionBf16 ? DType::kBF16 : DType::kF32;
  h.model.max_seq_len = header[2];
  h.model.vocab_size = header[3];
  h.model.n_layer = header[4];
  h.model.n_head = header[5];
  h.model.n_embd = header[6];
  h.model.padded_vocab_size = header[7];
  CheckFileSize(h, f);
  return h;
}

void Check(bool same, const char* what, int64_t in_file, int64_t configured,
           const std::string& path) {
  ZTRAIN_CHECK_T(ConfigError, same, "model file '", path, "' has ", what, " = ", in_file,
                 " but the config says ", configured, "; set model.", what, " to ", in_file);
}

void CheckSizes(const ModelConfig& h, const ModelConfig& m, const std::string& path) {
  Check(h.max_seq_len == m.max_seq_len, "max_seq_len", h.max_seq_len, m.max_seq_len, path);
  Check(h.vocab_size == m.vocab_size, "vocab_size", h.vocab_size, m.vocab_size, path);
  Check(h.n_layer == m.n_layer, "n_layer", h.n_layer, m.n_layer, path);
  Check(h.n_head == m.n_head, "n_head", h.n_head, m.n_head, path);
  Check(h.n_embd == m.n_embd, "n_embd", h.n_embd, m.n_embd, path);
  Check(h.padded_vocab_size == m.padded_vocab_size, "padded_vocab_size", h.padded_vocab_size,
        m.padded_vocab_size, path);
}

}  // namespace

// llm.c's order: the embeddings, then each block parameter kind (Gpt2Names::kBlockModules,
// weight then bias) for every layer, then the final norm.
std::vector<std::string> LlmcParamOrder(int n_layer) {
  using N = Gpt2Names;
  std::vector<std::string> names = {std::string(N::kTokens), std::string(N::kPositions)};
  for (std::string_view module : N::kBlockModules) {
    for (const char* part : {".weight", ".bias"}) {
      for (int l = 0; l < n_layer; ++l) names.push_back(N::Block(l) + std::string(module) + part);
    }
  }
  names.push_back(std::string(N::kFinalNorm) + ".weight");
  names.push_back(std::string(N::kFinalNorm) + ".bias");
  return names;
}

void SaveLlmcModel(const std::string& path, const ModelConfig& m, const ParamLookup& lookup,
                   DType dtype) {
  ZTRAIN_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "llm.c model file '", path,
               "' can hold fp32 or bf16 parameters, not ", DTypeName(dtype));
  int32_t header[256] = {};
  header[0] = kLlmcModelMagic;
  header[1] = dtype == DType::kBF16 ? kLlmcModelVersionBf16 : kLlmcModelVersion;
  header[2] = static_cast<int32_t>(m.max_seq_len);
  header[3] = static_cast<int32_t>(m.vocab_size);
  header[4] = m.n_layer;
  header[5] = m.n_head;
  header[6] = m.n_embd;
  header[7] = static_cast<int32_t>(m.padded_vocab_size);
  detail::AtomicFileWriter out(path, "model file");
  out.Write(header, sizeof header);
  std::vector<uint16_t> narrow;  // one parameter in bf16
  for (const std::string& name : LlmcParamOrder(m.n_layer)) {
    const Tensor t = lookup(name);
    ZTRAIN_ASSERT(t.dtype() == DType::kF32, "parameter ", name);
    if (dtype == DType::kF32) {
      out.Write(t.data(), t.nbytes());
      continue;
    }
    narrow.resize(static_cast<size_t>(t.numel()));
    ConvertFromFloat(t.data<float>(), narrow.data(), DType::kBF16, narrow.size());
    out.Write(narrow.data(), narrow.size() * sizeof(uint16_t));
  }
  out.Commit();
}

ModelConfig ReadLlmcModelHeader(const std::string& path) {
  return ReadHeader(detail::InputFile(path, "model file")).model;
}

DType ReadLlmcModelDType(const std::string& path) {
  return ReadHeader(detail::InputFile(path, "model file")).dtype;
}

void LoadLlmcModel(const std::string& path, const ModelConfig& m, const ParamLookup& lookup) {
  const detail::InputFile f(path, "model file");
  const LlmcHeader h = ReadHeader(f);
  CheckSizes(h.model, m, path);
  const size_t elem = DTypeSize(h.dtype);
  int64_t offset = kHeaderBytes;
  std::vector<uint16_t> narrow;  // one parameter in bf16
  for (const std::string& name : LlmcParamOrder(m.n_layer)) {
    const Tensor t = lookup(name);
    ZTRAIN_ASSERT(t.dtype() == DType::kF32, "parameter ", name);
    const size_t n = static_cast<size_t>(t.numel());
    void* dst = t.data();
    if (h.dtype == DType::kBF16) {
      narrow.resize(n);
      dst = narrow.data();
    }
    ZTRAIN_CHECK_T(IoError, f.ReadAt(offset, dst, n * elem), "model file '", path,
                   "' ends before parameter ", name, " (truncated file?)");
    if (h.dtype == DType::kBF16) ConvertToFloat(narrow.data(), DType::kBF16, t.data<float>(), n);
    offset += static_cast<int64_t>(n * elem);
  }
}

}  // namespace ztrain::nn
