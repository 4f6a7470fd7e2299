#include "checkpoint/checkpoint_export.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/config.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/staged_output.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "nn/adapters.h"
#include "nn/family.h"
#include "nn/hf_checkpoint.h"
#include "nn/init.h"
#include "nn/llmc_model_file.h"
#include "nn/model_export.h"
#include "nn/peft.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using ::ztrain::detail::StrCat;

// A checkpoint read whole: its step directory and metadata.
struct Chosen {
  std::string dir;
  nlohmann::json meta;
};

// `dir`'s metadata when every file is intact, else IoError naming what is not.
nlohmann::json IntactMeta(const std::string& dir) {
  const nlohmann::json meta = checkpoint::ReadMeta(dir);
  const std::string broken = checkpoint::VerifyFiles(dir, meta, 0, 1);
  ZTRAIN_CHECK_T(IoError, broken.empty(), "checkpoint ", dir, " is not intact: ", broken);
  return meta;
}

// The checkpoint to export: `path` itself when it is a step directory (which must be intact),
// else the newest intact checkpoint of the checkpoint.dir `path`, chosen as a resume chooses
// it (Note [Choosing a checkpoint]), saying so when it falls back.
Chosen ChooseCheckpoint(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  if (fs::exists(fs::path(path) / checkpoint::kMetaFile) || name.rfind("step", 0) == 0) {
    return {path, IntactMeta(path)};
  }
  ZTRAIN_CHECK_T(IoError, fs::is_directory(path), path,
                 " is neither a checkpoint (<checkpoint.dir>/step<N>) nor a checkpoint.dir");
  std::string latest_problem;
  const std::vector<int64_t> candidates = checkpoint::ResumeCandidates(path, &latest_problem);
  if (!latest_problem.empty()) Log().warn("{}; using the newest intact checkpoint", latest_problem);
  ZTRAIN_CHECK_T(IoError, !candidates.empty(), path, " holds no checkpoint (no step<N> with a ",
                 checkpoint::kMetaFile, ")");
  for (size_t c = 0; c < candidates.size(); ++c) {
    const std::string dir = path + "/" + checkpoint::StepName(candidates[c]);
    try {
      return {dir, IntactMeta(dir)};
    } catch (const IoError& e) {
      ZTRAIN_CHECK_T(IoError, c + 1 < candidates.size(), e.what(),
                     "; no intact checkpoint is left in ", path);
      Log().warn("{}; falling back to {}", e.what(), checkpoint::StepName(candidates[c + 1]));
    }
  }
  throw IoError("unreachable");
}

// Whether `file` is `dir` or lies below it (both resolved: links, "..", relative paths).
bool Inside(const std::string& file, const std::string& dir) {
  std::error_code ec;
  const fs::path f = fs::weakly_canonical(file, ec), d = fs::weakly_canonical(dir, ec);
  auto fi = f.begin();
  for (auto di = d.begin(); di != d.end(); ++di, ++fi) {
    if (di->empty()) continue;  // a trailing separator
    if (fi == f.end() || *fi != *di) return false;
  }
  return true;
}

// Never overwrite an input: the export may not land in the checkpoint directory it reads (it
// could replace a rank file, and pruning would delete it later) nor on, in or around what
// the checkpoint's run started from (model.init_from, lora.init_from), which the export
// reads too (the base of a merge, the tokenizer files it copies).
void CheckExportInputs(const std::string& out, const std::string& checkpoint_path,
                       const Chosen& chosen, const Config& config) {
  const std::string root = fs::exists(fs::path(checkpoint_path) / checkpoint::kMetaFile)
                               ? fs::path(chosen.dir).parent_path().string()
                               : checkpoint_path;
  ZTRAIN_CHECK_T(ConfigError, !Inside(out, root), "--out '", out,
                 "' is inside the checkpoint "
                 "directory '",
                 root,
                 "' that the export reads: it could replace the "
                 "checkpoint's files, and pruning old checkpoints would delete it; write it "
                 "elsewhere");
  CheckOutputIsNoInput(out, "--out",
                       {{"the checkpoint directory", root},
                        {"model.init_from of the run that saved the checkpoint",
                         config.model.init_from},
                        {"lora.init_from of the run that saved the checkpoint",
                         config.lora.init_from}});
}

void WriteJson(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  ZTRAIN_CHECK_T(IoError, out.good(), "cannot write ", path);
}

// The base model a LoRA run trained on, one whole fp32 parameter at a time: model.init_from
// (a HF directory read tensor by tensor, or an llm.c file read whole), or training.seed's.
// A weight the run kept quantized (QLoRA) is the values the run computed with: quantized as
// bitsandbytes quantizes it and dequantized (PEFT's merge_and_unload of a bitsandbytes model
// dequantizes the same way before it adds the adapter), so the merged model evaluates as the
// trained one did.
class BaseModel {
 public:
  explicit BaseModel(const Config& config) : config_(config) {
    std::error_code ec;
    ZTRAIN_CHECK_T(
        IoError, config.model.init_from.empty() || fs::exists(config.model.init_from, ec),
        "the base the LoRA run trained on, its model.init_from '", config.model.init_from,
        "', is not there (moved or deleted?): --merge adds the adapters to it; put "
        "it back at that path (or link it there), or export the adapter alone with "
        "--format peft");
    for (const auto& layer :
         nn::BuildModel(config.model, nn::MakeWholeLinears(), nn::AdapterPlan(config))) {
      for (const nn::ParamSpec& s : layer->Params()) specs_.emplace(s.name, s);
    }
    const std::string& path = config.model.init_from;
    if (nn::IsHfModelDir(path)) {
      hf_ = std::make_unique<nn::HfCheckpoint>(path);
      for (const nn::HfTensor& t : nn::FindModelFamily(config.model.type).hf.layout(config.model)) {
        layout_.emplace(t.param, t);
      }
    } else if (!path.empty()) {
      for (const nn::HfTensor& t : nn::FindModelFamily("gpt2").hf.layout(config.model)) {
        llmc_[t.param].resize(static_cast<size_t>(NumElements(t.param_shape)));
        shapes_[t.param] = t.param_shape;
      }
      nn::LoadLlmcModel(path, config.model, [&](const std::string& name) {
        return Tensor(llmc_.at(name).data(), DType::kF32, shapes_.at(name));
      });
    }
  }
  std::vector<float> Value(const std::string& name, int64_t n) const {
    std::vector<float> v(static_cast<size_t>(n));
    if (hf_) {
      nn::ReadHfParameter(*hf_, layout_.at(name), 0, n, v.data());
    } else if (!llmc_.empty()) {
      v = llmc_.at(name);
    } else {
      nn::InitParam(specs_.at(name), config_.training.seed, Tensor(v.data(), DType::kF32, {n}));
    }
    const nn::ParamSpec& spec = specs_.at(name);
    if (spec.quantized()) {
      std::vector<uint8_t> blob(
          static_cast<size_t>(kernels::LayoutOf(spec.quant, spec.quant_geometry).total));
      kernels::QuantizeInto(spec.quant, spec.quant_geometry, v.data(), blob.data());
      ops_->Dequantize(Tensor(blob.data(), DType::kU8, {static_cast<int64_t>(blob.size())}),
                       spec.quant, spec.quant_geometry,
                       Tensor(v.data(), DType::kF32, spec.shape));
    }
    return v;
  }

 private:
  const Config& config_;
  std::unique_ptr<nn::HfCheckpoint> hf_;
  std::map<std::string, nn::HfTensor> layout_;
  std::map<std::string, std::vector<float>> llmc_;
  std::map<std::string, Shape> shapes_;
  std::map<std::string, nn::ParamSpec> specs_;
  std::unique_ptr<kernels::Ops> ops_ = kernels::MakeCpuOps();
};

// The merged model (PEFT's merge_and_unload) into `writer`: W + scaling B A for each adapted
// weight, the trained tensors as the checkpoint holds them, the rest the base's.
int64_t WriteMerged(const Config& config, const checkpoint::ModelIndex& index,
                    nn::HfModelWriter& writer) {
  std::map<std::string, Shape> trained(index.parameters().begin(), index.parameters().end());
  const auto read = [&](const std::string& name) {
    std::vector<float> v(static_cast<size_t>(NumElements(trained.at(name))));
    index.Read(name, checkpoint::Kind::kParam, 0, static_cast<int64_t>(v.size()), v.data());
    return v;
  };
  const BaseModel base(config);
  const std::unique_ptr<kernels::Ops> ops = kernels::MakeCpuOps();
  const float scaling = static_cast<float>(config.lora.scaling());
  int64_t elements = 0;
  for (const nn::HfTensor& t : nn::FindModelFamily(config.model.type).hf.layout(config.model)) {
    const int64_t n = NumElements(t.param_shape);
    std::vector<float> w = trained.count(t.param) ? read(t.param) : base.Value(t.param, n);
    const std::string linear = nn::ModuleOf(t.param);
    if (trained.count(linear + ".lora_A.weight") != 0 && t.param == linear + ".weight") {
      const std::vector<float> a = read(linear + ".lora_A.weight");
      const std::vector<float> b = read(linear + ".lora_B.weight");
      const Shape& as = trained.at(linear + ".lora_A.weight");  // [r, in]
      const int64_t out = n / as[1];
      ops->Gemm(false, false, scaling,
                Tensor(const_cast<float*>(b.data()), DType::kF32, {out, as[0]}),
                Tensor(const_cast<float*>(a.data()), DType::kF32, as), 1.0f,
                Tensor(w.data(), DType::kF32, {out, as[1]}));  // W += scaling B A
    }
    writer.Add(t.param, w.data());
    elements += n;
  }
  return elements;
}

}  // namespace

ExportResult ExportCheckpoint(const std::string& checkpoint, const std::string& format,
                              const std::string& out, DType dtype, int64_t max_shard_bytes,
                              bool merge, bool overwrite) {
  ZTRAIN_CHECK_T(ConfigError,
                 format == "llmc" || format == "safetensors" || format == "hf" || format == "peft",
                 "--format must be hf, llmc, safetensors or peft, got '", format, "'");
  const bool sixteen = format == "hf" || format == "peft";
  ZTRAIN_CHECK_T(ConfigError,
                 dtype == DType::kF32 || dtype == DType::kBF16 || (sixteen && dtype == DType::kF16),
                 "--dtype must be fp32 or bf16", sixteen ? " or fp16" : "");
  ExportResult result;
  const Chosen chosen = ChooseCheckpoint(checkpoint);
  const nlohmann::json& meta = chosen.meta;
  result.checkpoint = chosen.dir;
  result.step = meta.at("step");
  const Config config = ParseConfig(meta.at("config"), meta.at("layout").at("world"));
  CheckExportInputs(out, checkpoint, chosen, config);
  const bool lora = config.lora.enabled;
  ZTRAIN_CHECK_T(ConfigError, !(format == "peft" || merge) || lora,
                 "--format peft and --merge "
                 "export LoRA runs; this checkpoint trained the whole model: use --format hf");
  ZTRAIN_CHECK_T(ConfigError, !lora || format == "peft" || (format == "hf" && merge),
                 "this checkpoint holds LoRA adapters (the base is model.init_from's, not "
                 "saved): --format peft writes the adapter, --format hf --merge the base with "
                 "the adapters merged in");
  ZTRAIN_CHECK_T(ConfigError, !merge || format == "hf", "--merge writes --format hf");
  ZTRAIN_CHECK_T(ConfigError, format == "hf" || format == "peft" || config.model.type == "gpt2",
                 "--format ", format, " writes GPT-2 models; this checkpoint's model.type is '",
                 config.model.type, "': use --format hf");
  const checkpoint::ModelIndex index(result.checkpoint, meta);
  // Note [Staged outputs]: the export appears at --out whole, or not at all.
  const bool directory = format == "hf" || format == "peft";
  StagedOutput staged(out, directory ? StagedOutput::Kind::kDirectory : StagedOutput::Kind::kFile,
                      overwrite, "--out");
  const std::string& dir = staged.path();
  if (format == "peft") {
    std::map<std::string, std::vector<float>> values;
    for (const auto& [name, shape] : index.parameters()) {
      std::vector<float>& v = values[name];
      v.resize(static_cast<size_t>(NumElements(shape)));
      index.Read(name, checkpoint::Kind::kParam, 0, NumElements(shape), v.data());
      result.parameters += NumElements(shape);
    }
    nn::WritePeftAdapter(dir, config.model, config.lora, dtype,
                         [&](const std::string& name) { return values.at(name).data(); });
    staged.Commit();
    result.files = 2;
    return result;
  }
  if (merge) {
    nn::HfModelWriter writer(dir, config.model, dtype, max_shard_bytes);
    result.parameters = WriteMerged(config, index, writer);
    nn::CopyHfCompanionFiles(config.model.init_from, dir);
    result.files = writer.Finish();
    staged.Commit();
    return result;
  }
  const auto read = [&](const std::string& name, const Shape& shape) {
    std::vector<float> v(static_cast<size_t>(NumElements(shape)));
    index.Read(name, checkpoint::Kind::kParam, 0, NumElements(shape), v.data());
    result.parameters += NumElements(shape);
    return v;
  };
  if (format == "hf") {
    // One parameter in memory at a time (and one shard of output bytes).
    nn::HfModelWriter writer(dir, config.model, dtype, max_shard_bytes);
    for (const auto& [name, shape] : index.parameters()) writer.Add(name, read(name, shape).data());
    nn::CopyHfCompanionFiles(config.model.init_from, dir);
    result.files = writer.Finish();
    staged.Commit();
    return result;
  }
  std::map<std::string, std::pair<Shape, std::vector<float>>> values;
  for (const auto& [name, shape] : index.parameters()) values[name] = {shape, read(name, shape)};
  const nn::ParamLookup lookup = [&values](const std::string& name) {
    auto it = values.find(name);
    ZTRAIN_CHECK_T(IoError, it != values.end(), "the checkpoint has no parameter '", name, "'");
    return Tensor(it->second.second.data(), DType::kF32, it->second.first);
  };
  if (format == "llmc") {
    nn::SaveLlmcModel(dir, config.model, lookup, dtype);
  } else {
    // config.json beside the file is an output too: staged, and refused when it is another
    // model's unless --overwrite.
    const std::string config_json = (fs::absolute(out).parent_path() / "config.json").string();
    CheckOutputIsNoInput(config_json, "config.json beside --out",
                         {{"model.init_from of the run that saved the checkpoint",
                           config.model.init_from}});
    StagedOutput staged_config(config_json, StagedOutput::Kind::kFile, overwrite,
                               "config.json beside --out");
    nn::SaveHfGpt2Safetensors(dir, config.model, lookup, dtype);
    WriteJson(staged_config.path(),
              nn::FindModelFamily("gpt2").hf.write_config(config.model, dtype));
    staged_config.Commit();
  }
  staged.Commit();
  result.files = 1;
  return result;
}

}  // namespace ztrain
