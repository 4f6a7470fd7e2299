#include "run/model_weights.h"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "core/logging.h"
#include "core/staged_output.h"
#include "nn/family.h"
#include "nn/hf_checkpoint.h"
#include "nn/llmc_model_file.h"
#include "nn/peft.h"

namespace ztrain {
namespace {

using ::ztrain::detail::StrCat;

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

// IoError naming the file and the tensor when a value read is NaN or infinite: the file is
// damaged, or was saved by a run that diverged, and training from it would blame the
// learning rate.
void CheckFinite(const float* v, int64_t n, int64_t first, const std::string& tensor,
                 const std::string& file) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(v[i])) continue;
    throw IoError(StrCat(file, ": tensor '", tensor, "' holds ",
                         std::isnan(v[i]) ? "NaN" : "an infinity", " at element ", first + i,
                         ": the file is damaged or was saved by a run that diverged; load "
                         "another checkpoint of the model"));
  }
}

// Every staged parameter of an llm.c file, checked (CheckFinite).
void CheckStagedFinite(const StagedModel& staged, const std::string& path) {
  for (const auto& [name, values] : staged) {
    CheckFinite(values.data(), static_cast<int64_t>(values.size()), 0, name, path);
  }
}

LoadedWeights LoadLlmc(const std::string& path, const ModelConfig& model, Engine& e) {
  StagedModel staged;
  const auto element = static_cast<int64_t>(DTypeSize(nn::ReadLlmcModelDType(path)));
  std::map<std::string, bool> in_file;  // GPT-2's parameters; others are LoRA's adapters
  for (const nn::HfTensor& t : nn::FindModelFamily("gpt2").hf.layout(model))
    in_file[t.param] = true;
  int64_t bytes = 0;
  for (const auto& [name, shape] : e.ModelParameters()) {
    std::vector<float>& v = staged[name];
    v.resize(NumElements(shape));
    if (in_file.count(name) != 0) {
      bytes += NumElements(shape) * element;
    } else {
      e.InitialValues(name, 0, NumElements(shape), v.data());
    }
  }
  nn::LoadLlmcModel(path, model, LookupIn(staged, e));
  CheckStagedFinite(staged, path);
  e.SetFullParameters([&staged](const std::string& name, const Tensor& out) {
    std::memcpy(out.data(), staged.at(name).data(), out.nbytes());
  });
  return {"llm.c model file", bytes, bytes};
}

// The tensors of `layout` in `ckpt` (checked: present, shaped, readable), for SetHeldParameters:
// what each parameter is, and the bytes read as the fill reads them (`loaded`).
class LayoutReader {
 public:
  LayoutReader(const nn::HfCheckpoint& ckpt, const std::vector<nn::HfTensor>& layout,
               const nn::HfFamily& family, const char* unused_why, LoadedWeights& loaded)
      : ckpt_(ckpt), loaded_(loaded) {
    const std::vector<std::string> unused = nn::CheckHfTensors(ckpt, layout, family);
    if (!unused.empty()) {
      Log().warn("{}: {} tensors {} and are not read (first: '{}')", ckpt.dir(), unused.size(),
                 unused_why, unused.front());
    }
    for (const nn::HfTensor& t : layout) {
      const nn::SafetensorsEntry* entry = ckpt.Find(t.hf_name);
      by_param_[t.param] = {&t, nn::SafetensorsDTypeSize(entry->dtype)};
      loaded_.bytes_in_file += entry->end - entry->begin;
    }
  }
  // The layout's tensor of `param`, or nullptr.
  const nn::HfTensor* Find(const std::string& param) const {
    auto it = by_param_.find(param);
    return it == by_param_.end() ? nullptr : it->second.first;
  }
  void Read(const std::string& param, int64_t begin, int64_t count, float* out) {
    const auto& [t, element] = by_param_.at(param);
    loaded_.bytes_read += nn::ReadHfParameter(ckpt_, *t, begin, count, out) * element;
    CheckFinite(out, count, begin, t->hf_name, ckpt_.FileOf(t->hf_name));
  }

 private:
  const nn::HfCheckpoint& ckpt_;
  LoadedWeights& loaded_;
  std::map<std::string, std::pair<const nn::HfTensor*, int64_t>> by_param_;
};

LoadedWeights LoadHf(const std::string& dir, const ModelConfig& model, Engine& e) {
  const nn::HfFamily& family = nn::FindModelFamily(model.type).hf;
  const nn::HfCheckpoint ckpt(dir);
  const std::vector<nn::HfTensor> layout = family.layout(model);
  LoadedWeights loaded{"Hugging Face directory", 0, 0};
  LayoutReader reader(ckpt, layout, family,
                      ("are not parameters of the " + model.type + " model").c_str(), loaded);
  e.SetHeldParameters([&](const std::string& name, const Shape& full_shape, int64_t begin,
                          int64_t count, float* out) {
    const nn::HfTensor* t = reader.Find(name);
    if (t == nullptr) {  // not the base's: a LoRA adapter
      e.InitialValues(name, begin, count, out);
      return;
    }
    ZTRAIN_CHECK(t->param_shape == full_shape, "the Hugging Face layout of model.type '",
                 model.type, "' does not describe parameter '", name, "' ",
                 ShapeToString(full_shape));
    reader.Read(name, begin, count, out);
  });
  return loaded;
}

// The whole model of an llm.c file, staged by name (the file is read in one pass).
StagedModel StageLlmc(const std::string& path, const ModelConfig& model) {
  StagedModel staged;
  std::map<std::string, Shape> shapes;
  for (const nn::HfTensor& t : nn::FindModelFamily("gpt2").hf.layout(model)) {
    shapes[t.param] = t.param_shape;
    staged[t.param].resize(static_cast<size_t>(NumElements(t.param_shape)));
  }
  nn::LoadLlmcModel(path, model, [&](const std::string& name) {
    const auto it = staged.find(name);
    ZTRAIN_CHECK(it != staged.end(), "the model has no parameter '", name, "'");
    return Tensor(it->second.data(), DType::kF32, shapes.at(name));
  });
  CheckStagedFinite(staged, path);
  return staged;
}

}  // namespace

std::unique_ptr<nn::Decoder> LoadDecoder(const std::string& path, const ModelConfig& model) {
  if (!nn::IsHfModelDir(path)) {
    const StagedModel staged = StageLlmc(path, model);
    return std::make_unique<nn::Decoder>(model, [&](const std::string& name, const Tensor& out) {
      std::memcpy(out.data(), staged.at(name).data(), out.nbytes());
    });
  }
  const nn::HfFamily& family = nn::FindModelFamily(model.type).hf;
  const nn::HfCheckpoint ckpt(path);
  const std::vector<nn::HfTensor> layout = family.layout(model);
  LoadedWeights loaded{"Hugging Face directory", 0, 0};
  LayoutReader reader(ckpt, layout, family,
                      ("are not parameters of the " + model.type + " model").c_str(), loaded);
  return std::make_unique<nn::Decoder>(model, [&](const std::string& name, const Tensor& out) {
    ZTRAIN_CHECK(reader.Find(name) != nullptr, path, " holds no tensor for parameter '", name,
                 "'");
    reader.Read(name, 0, out.numel(), out.data<float>());
  });
}

LoadedWeights LoadModelWeights(const std::string& path, const ModelConfig& model, Engine& e) {
  return nn::IsHfModelDir(path) ? LoadHf(path, model, e) : LoadLlmc(path, model, e);
}

LoadedWeights LoadPeftAdapter(const std::string& dir, const Config& config, Engine& e) {
  const std::vector<nn::HfTensor> layout = nn::PeftLayout(config.model, config.lora);
  const nn::HfCheckpoint ckpt(dir, nn::kPeftAdapterFiles);
  LoadedWeights loaded{"PEFT adapter directory", 0, 0};
  LayoutReader reader(ckpt, layout, nn::FindModelFamily(config.model.type).hf,
                      "are not trained by this config's lora section", loaded);
  e.SetHeldParameters(
      [&](const std::string& name, const Shape&, int64_t begin, int64_t count, float* out) {
        reader.Read(name, begin, count, out);
      },
      [&](const std::string& name) { return reader.Find(name) != nullptr; });
  return loaded;
}

// Note [Staged outputs]: the final save appears whole, replacing the previous one in one step,
// so a run killed while saving leaves the previous save (preflight refuses a directory that
// holds anything but a model's files, which the replacement would delete).
std::string SaveModelWeights(const std::string& path, const Config& config, Engine& e) {
  const ModelConfig& model = config.model;
  const auto stage = [&path](StagedOutput::Kind kind) {
    return std::make_unique<StagedOutput>(path, kind, /*overwrite=*/true, "training.save_final");
  };
  if (config.lora.enabled) {
    StagedModel values;
    e.ForEachModelParameter(
        [&](const std::string& name, const Tensor& value) {
          const float* p = value.data<float>();
          values[name].assign(p, p + value.numel());
        },
        /*trainable_only=*/true);
    if (values.empty()) return "PEFT adapter directory";  // written by another rank
    const auto staged = stage(StagedOutput::Kind::kDirectory);
    nn::WritePeftAdapter(staged->path(), model, config.lora, DType::kF32,
                         [&](const std::string& name) { return values.at(name).data(); });
    staged->Commit();
    return fmt::format("PEFT adapter directory, fp32, {} tensors of the base {}", values.size(),
                       model.init_from.empty() ? "from training.seed" : model.init_from);
  }
  if (!nn::NamesHfModelDir(path)) {
    StagedModel values;
    bool writer = false;
    e.ForEachModelParameter([&](const std::string& name, const Tensor& value) {
      writer = true;
      const float* p = value.data<float>();
      values[name].assign(p, p + value.numel());
    });
    if (writer) {
      const auto staged = stage(StagedOutput::Kind::kFile);
      nn::SaveLlmcModel(staged->path(), model, LookupIn(values, e));
      staged->Commit();
    }
    return "llm.c model file";
  }
  std::unique_ptr<StagedOutput> staged;   // on the rank that receives the parameters
  std::unique_ptr<nn::HfModelWriter> writer;
  e.ForEachModelParameter([&](const std::string& name, const Tensor& value) {
    if (!writer) {
      staged = stage(StagedOutput::Kind::kDirectory);
      writer = std::make_unique<nn::HfModelWriter>(staged->path(), model, DType::kF32);
    }
    writer->Add(name, value.data<float>());
  });
  if (!writer) return "Hugging Face directory";
  const int copied = nn::CopyHfCompanionFiles(model.init_from, staged->path());
  const int shards = writer->Finish();
  staged->Commit();
  return fmt::format("Hugging Face directory, fp32, {} safetensors file{}{}", shards,
                     shards == 1 ? "" : "s",
                     copied ? fmt::format(", {} tokenizer/generation files from {}", copied,
                                          model.init_from)
                            : "");
}

}  // namespace ztrain
