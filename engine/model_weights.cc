#include "engine/model_weights.h"

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "core/logging.h"
#include "nn/family.h"
#include "nn/hf_checkpoint.h"
#include "nn/llmc_model_file.h"

namespace ztrain {
namespace {

// The whole model as name -> fp32 values: llm.c files are read and written whole, while at
// ZeRO stage 3 no rank holds whole parameters.
using StagedModel = std::map<std::string, std::vector<float>>;

nn::ParamLookup LookupIn(StagedModel& staged, const Engine& e) {
  std::map<std::string, Shape> shapes;
  for (const auto& [name, shape] : e.ModelParameters()) shapes[name] = shape;
  return [&staged, shapes](const std::string& name) {
    auto it = staged.find(name);
    ZTRAIN_CHECK(it != staged.end(), "the model has no parameter '", name, "'");
    return Tensor(it->second.data(), DType::kF32, shapes.at(name));
  };
}

LoadedWeights LoadLlmc(const std::string& path, const ModelConfig& model, Engine& e) {
  StagedModel staged;
  const auto element = static_cast<int64_t>(DTypeSize(nn::ReadLlmcModelDType(path)));
  int64_t bytes = 0;
  for (const auto& [name, shape] : e.ModelParameters()) {
    staged[name].resize(NumElements(shape));
    bytes += NumElements(shape) * element;
  }
  nn::LoadLlmcModel(path, model, LookupIn(staged, e));
  e.SetFullParameters([&staged](const std::string& name, const Tensor& out) {
    std::memcpy(out.data(), staged.at(name).data(), out.nbytes());
  });
  return {"llm.c model file", bytes, bytes};
}

LoadedWeights LoadHf(const std::string& dir, const ModelConfig& model, Engine& e) {
  const nn::HfFamily& family = nn::FindModelFamily(model.type).hf;
  const nn::HfCheckpoint ckpt(dir);
  const std::vector<nn::HfTensor> layout = family.layout(model);
  const std::vector<std::string> unused = nn::CheckHfTensors(ckpt, layout, family);
  if (!unused.empty()) {
    Log().warn("{}: {} tensors are not parameters of the {} model and are not read (first: "
               "'{}')",
               dir, unused.size(), model.type, unused.front());
  }
  LoadedWeights loaded{"Hugging Face directory", 0, 0};
  std::map<std::string, const nn::HfTensor*> by_param;
  std::map<std::string, int64_t> element_bytes;
  for (const nn::HfTensor& t : layout) {
    by_param[t.param] = &t;
    const nn::SafetensorsEntry* entry = ckpt.Find(t.hf_name);
    element_bytes[t.param] = nn::SafetensorsDTypeSize(entry->dtype);
    loaded.bytes_in_file += entry->end - entry->begin;
  }
  e.SetHeldParameters([&](const std::string& name, const Shape& full_shape, int64_t begin,
                          int64_t count, float* out) {
    auto it = by_param.find(name);
    ZTRAIN_CHECK(it != by_param.end() && it->second->param_shape == full_shape,
                 "the Hugging Face layout of model.type '", model.type,
                 "' does not describe parameter '", name, "' ", ShapeToString(full_shape));
    loaded.bytes_read +=
        nn::ReadHfParameter(ckpt, *it->second, begin, count, out) * element_bytes[name];
  });
  return loaded;
}

}  // namespace

LoadedWeights LoadModelWeights(const std::string& path, const ModelConfig& model, Engine& e) {
  return nn::IsHfModelDir(path) ? LoadHf(path, model, e) : LoadLlmc(path, model, e);
}

std::string SaveModelWeights(const std::string& path, const ModelConfig& model, Engine& e) {
  if (!nn::NamesHfModelDir(path)) {
    StagedModel staged;
    bool writer = false;
    e.ForEachModelParameter([&](const std::string& name, const Tensor& value) {
      writer = true;
      const float* p = value.data<float>();
      staged[name].assign(p, p + value.numel());
    });
    if (writer) nn::SaveLlmcModel(path, model, LookupIn(staged, e));
    return "llm.c model file";
  }
  std::unique_ptr<nn::HfModelWriter> writer;  // on the rank that receives the parameters
  e.ForEachModelParameter([&](const std::string& name, const Tensor& value) {
    if (!writer) writer = std::make_unique<nn::HfModelWriter>(path, model, DType::kF32);
    writer->Add(name, value.data<float>());
  });
  if (!writer) return "Hugging Face directory";
  const int copied = nn::CopyHfCompanionFiles(model.init_from, path);
  const int shards = writer->Finish();
  return fmt::format("Hugging Face directory, fp32, {} safetensors file{}{}", shards,
                     shards == 1 ? "" : "s",
                     copied ? fmt::format(", {} tokenizer/generation files from {}", copied,
                                          model.init_from)
                            : "");
}

}  // namespace ztrain
