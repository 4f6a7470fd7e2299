#include "nn/llmc_model_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace ztrain::nn {
namespace {

constexpr const char* kBlockParams[] = {
    "ln_1.weight", "ln_1.bias",   "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File Open(const std::string& path, const char* mode) {
  File f(std::fopen(path.c_str(), mode));
  ZTRAIN_CHECK_T(IoError, f != nullptr, "cannot open model file '", path, "': ",
                 std::strerror(errno));
  return f;
}

void Check(bool same, const char* what, int64_t in_file, int64_t configured,
           const std::string& path) {
  ZTRAIN_CHECK_T(ConfigError, same, "model file '", path, "' has ", what, " = ", in_file,
                 " but the config says ", configured, "; set model.", what, " to ", in_file);
}

}  // namespace

std::vector<std::string> LlmcParamOrder(int n_layer) {
  std::vector<std::string> names = {"wte", "wpe"};
  for (const char* kind : kBlockParams)
    for (int l = 0; l < n_layer; ++l) names.push_back("h." + std::to_string(l) + "." + kind);
  names.push_back("ln_f.weight");
  names.push_back("ln_f.bias");
  return names;
}

void SaveLlmcModel(const std::string& path, const ModelConfig& m, const ParamLookup& lookup) {
  int32_t header[256] = {};
  header[0] = kLlmcModelMagic;
  header[1] = kLlmcModelVersion;
  header[2] = static_cast<int32_t>(m.max_seq_len);
  header[3] = static_cast<int32_t>(m.vocab_size);
  header[4] = m.n_layer;
  header[5] = m.n_head;
  header[6] = m.n_embd;
  header[7] = static_cast<int32_t>(m.padded_vocab_size);
  const std::string tmp = path + ".tmp";
  {
    File f = Open(tmp, "wb");
    bool ok = std::fwrite(header, sizeof header, 1, f.get()) == 1;
    for (const std::string& name : LlmcParamOrder(m.n_layer)) {
      const Tensor t = lookup(name);
      ZTRAIN_ASSERT(t.dtype() == DType::kF32, "parameter ", name);
      ok = ok && std::fwrite(t.data(), 1, t.nbytes(), f.get()) == t.nbytes();
    }
    ok = ok && std::fflush(f.get()) == 0;
    if (!ok) {
      const int err = errno;
      std::remove(tmp.c_str());
      throw IoError(detail::StrCat("writing model file '", tmp, "' failed: ", std::strerror(err)));
    }
  }
  ZTRAIN_CHECK_T(IoError, std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp,
                 "' to '", path, "': ", std::strerror(errno));
}

ModelConfig ReadLlmcModelHeader(const std::string& path) {
  File f = Open(path, "rb");
  int32_t header[256];
  ZTRAIN_CHECK_T(IoError, std::fread(header, sizeof header, 1, f.get()) == 1, "model file '",
                 path, "' is shorter than its 1024-byte header");
  ZTRAIN_CHECK_T(IoError, header[0] == kLlmcModelMagic, "'", path,
                 "' is not an llm.c model file (magic ", header[0], ", expected ",
                 kLlmcModelMagic, ")");
  ZTRAIN_CHECK_T(IoError, header[1] == kLlmcModelVersion, "model file '", path, "' has version ",
                 header[1], "; only version 3 (fp32) is supported");
  ModelConfig m;
  m.max_seq_len = header[2];
  m.vocab_size = header[3];
  m.n_layer = header[4];
  m.n_head = header[5];
  m.n_embd = header[6];
  m.padded_vocab_size = header[7];
  return m;
}

void LoadLlmcModel(const std::string& path, const ModelConfig& m, const ParamLookup& lookup) {
  const ModelConfig h = ReadLlmcModelHeader(path);
  Check(h.max_seq_len == m.max_seq_len, "max_seq_len", h.max_seq_len, m.max_seq_len, path);
  Check(h.vocab_size == m.vocab_size, "vocab_size", h.vocab_size, m.vocab_size, path);
  Check(h.n_layer == m.n_layer, "n_layer", h.n_layer, m.n_layer, path);
  Check(h.n_head == m.n_head, "n_head", h.n_head, m.n_head, path);
  Check(h.n_embd == m.n_embd, "n_embd", h.n_embd, m.n_embd, path);
  Check(h.padded_vocab_size == m.padded_vocab_size, "padded_vocab_size", h.padded_vocab_size,
        m.padded_vocab_size, path);
  File f = Open(path, "rb");
  ZTRAIN_CHECK_T(IoError, std::fseek(f.get(), 1024, SEEK_SET) == 0, "seek in '", path, "'");
  for (const std::string& name : LlmcParamOrder(m.n_layer)) {
    const Tensor t = lookup(name);
    ZTRAIN_CHECK_T(IoError, std::fread(t.data(), 1, t.nbytes(), f.get()) == t.nbytes(),
                   "model file '", path, "' ends before parameter ", name,
                   " (truncated file?)");
  }
  char extra;
  ZTRAIN_CHECK_T(IoError, std::fread(&extra, 1, 1, f.get()) == 0, "model file '", path,
                 "' is longer than its header describes (wrong file or corrupted)");
}

}  // namespace ztrain::nn
