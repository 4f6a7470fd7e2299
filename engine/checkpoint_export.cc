#include "engine/checkpoint_export.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "engine/checkpoint.h"
#include "nn/llmc_model_file.h"
#include "nn/model_export.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using ::ztrain::detail::StrCat;

// The step directory `path` names: itself, or what its `latest` names.
std::string StepDirectory(const std::string& path) {
  if (fs::exists(fs::path(path) / checkpoint::kMetaFile)) return path;
  const int64_t latest = checkpoint::ReadLatest(path);
  ZTRAIN_CHECK_T(IoError, latest >= 0, path, " is neither a checkpoint (no ", checkpoint::kMetaFile,
                 ") nor a checkpoint.dir with a `latest`");
  return path + "/" + checkpoint::StepName(latest);
}

// config.json for transformers' GPT2LMHeadModel.
void WriteHfConfig(const std::string& dir, const ModelConfig& m, DType dtype) {
  const nlohmann::json config = {{"architectures", {"GPT2LMHeadModel"}},
                                 {"model_type", "gpt2"},
                                 {"vocab_size", m.vocab_size},
                                 {"n_positions", m.max_seq_len},
                                 {"n_ctx", m.max_seq_len},
                                 {"n_embd", m.n_embd},
                                 {"n_layer", m.n_layer},
                                 {"n_head", m.n_head},
                                 {"activation_function", "gelu_new"},
                                 {"layer_norm_epsilon", 1e-5},
                                 {"tie_word_embeddings", true},
                                 {"torch_dtype", dtype == DType::kBF16 ? "bfloat16" : "float32"}};
  const std::string path = (fs::path(dir) / "config.json").string();
  std::ofstream out(path);
  out << config.dump(2) << "\n";
  ZTRAIN_CHECK_T(IoError, out.good(), "cannot write ", path);
}

}  // namespace

ExportResult ExportCheckpoint(const std::string& checkpoint, const std::string& format,
                              const std::string& out, DType dtype) {
  ZTRAIN_CHECK_T(ConfigError, format == "llmc" || format == "safetensors",
                 "--format must be llmc or safetensors, got '", format, "'");
  ZTRAIN_CHECK_T(ConfigError, dtype == DType::kF32 || dtype == DType::kBF16,
                 "--dtype must be fp32 or bf16");
  ExportResult result;
  result.checkpoint = StepDirectory(checkpoint);
  const nlohmann::json meta = checkpoint::ReadMeta(result.checkpoint);
  const std::string broken = checkpoint::VerifyFiles(result.checkpoint, meta, 0, 1);
  ZTRAIN_CHECK_T(IoError, broken.empty(), "checkpoint ", result.checkpoint, " is not intact: ",
                 broken);
  result.step = meta.at("step");
  const Config config = ParseConfig(meta.at("config"), meta.at("layout").at("world"));
  const checkpoint::ModelIndex index(result.checkpoint, meta);
  std::map<std::string, std::pair<Shape, std::vector<float>>> values;
  for (const auto& [name, shape] : index.parameters()) {
    std::vector<float>& v = values[name].second;
    values[name].first = shape;
    v.resize(static_cast<size_t>(NumElements(shape)));
    index.Read(name, checkpoint::Kind::kParam, 0, NumElements(shape), v.data());
    result.parameters += NumElements(shape);
  }
  const nn::ParamLookup lookup = [&values](const std::string& name) {
    auto it = values.find(name);
    ZTRAIN_CHECK_T(IoError, it != values.end(), "the checkpoint has no parameter '", name, "'");
    return Tensor(it->second.second.data(), DType::kF32, it->second.first);
  };
  const fs::path parent = fs::absolute(out).parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  ZTRAIN_CHECK_T(IoError, !ec, "cannot create ", parent.string(), " for --out: ", ec.message());
  if (format == "llmc") {
    nn::SaveLlmcModel(out, config.model, lookup, dtype);
  } else {
    nn::SaveHfGpt2Safetensors(out, config.model, lookup, dtype);
    WriteHfConfig(parent.string(), config.model, dtype);
  }
  return result;
}

}  // namespace ztrain
