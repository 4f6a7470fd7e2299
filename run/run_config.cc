// Note [A run's config] (run/run_config.h).
#include "run/run_config.h"

#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/logging.h"
#include "core/memory_tracker.h"
#include "data/token_source.h"
#include "estimate/estimate.h"
#include "estimate/tune.h"
#include "kernels/cpu/bf16_speed.h"
#include "kernels/ops.h"
#include "nn/family.h"
#include "nn/hf_checkpoint.h"
#include "nn/llmc_model_file.h"
#include "nn/peft.h"
#include "run/device_select.h"

namespace ztrain {
namespace {

using detail::StrCat;
using nlohmann::json;

// The most train_micro_batch_size_per_gpu "auto" considers (ztrain tune's default cap).
constexpr int64_t kMaxAutoMicroBatch = 4096;
// The share of a rank's device memory an "auto" micro-batch may fill by the estimate.
constexpr double kAutoMemoryShare = 0.9;

struct Resolution {
  std::vector<std::string> problems;
  std::vector<AutoChoice> choices;
  // A key taken from a user's file, as that file names it: "model.n_head" ->
  // "DIR/config.json: num_attention_heads".
  std::vector<std::pair<std::string, std::string>> sources;
};

// A problem "model.n_head: must be >= 1, got 0" about a key taken from a user's file, in
// that file's words: "DIR/config.json: num_attention_heads must be >= 1, got 0 (ztrain's
// model.n_head)".
std::string InTheirWords(const std::string& problem, const Resolution& r) {
  for (const auto& [key, source] : r.sources) {
    if (problem.rfind(key + ": ", 0) == 0) {
      return StrCat(source, " ", problem.substr(key.size() + 2), " (ztrain's ", key, ")");
    }
  }
  return problem;
}

// Takes the keys `file` sets into the config's section `section_name` (`section`: "model",
// or "lora" from a PEFT adapter) where the config leaves them out or "auto"; a value it gives
// that differs is a problem naming both, and `setter` (what sets the key). `prefix` is the
// key path below the section ("rope_scaling.").
void TakeKeys(json& section, const json& file, const std::string& section_name,
              const std::string& prefix, const std::string& path, const char* setter, json& taken,
              Resolution& r) {
  for (const auto& [key, value] : file.items()) {
    if (value.is_object()) {
      if (!section.contains(key) || section[key] == "auto") section[key] = json::object();
      if (section[key].is_object()) {
        TakeKeys(section[key], value, section_name, prefix + key + ".", path, setter, taken, r);
      }
      continue;
    }
    const json given = section.value(key, json("auto"));
    if (given == "auto") {
      section[key] = value;
      taken[prefix + key] = value;
    } else if (given != value && !(given.is_number() && value.is_number() &&
                                   given.get<double>() == value.get<double>())) {
      r.problems.push_back(StrCat(section_name, ".", prefix, key, ": the config says ",
                                  given.dump(), " but ", section_name, ".init_from '", path,
                                  "' has ", value.dump(), "; remove ", section_name, ".", prefix,
                                  key, " (", setter, ") or make them agree"));
    }
  }
}

void TakeModelKeys(json& model, const json& file, const std::string& prefix,
                   const std::string& path, const char* setter, json& taken, Resolution& r) {
  TakeKeys(model, file, "model", prefix, path, setter, taken, r);
}

// Step 1b: a PEFT adapter's adapter_config.json sets the lora section (nn/peft.h).
void LoraFromAdapterDir(json& j, Resolution& r) {
  if (!j.is_object() || !j.contains("lora") || !j["lora"].is_object()) return;
  json& lora = j["lora"];
  const json init = lora.value("init_from", json(""));
  if (!init.is_string() || init.get<std::string>().empty()) return;
  const std::string path = init.get<std::string>();
  json keys;
  try {
    keys = nn::ReadPeftConfig(path);
  } catch (const Error& e) {
    r.problems.push_back(StrCat("lora.init_from: ", e.what()));
    return;
  }
  json taken = json::object();
  TakeKeys(lora, keys, "lora", "", path, "the adapter sets it", taken, r);
  if (!taken.empty()) {
    r.choices.push_back(
        {"lora", taken, StrCat("from the adapter_config.json of lora.init_from '", path, "'")});
  }
}

// Step 1 for a Hugging Face directory: its config.json through its family's adapter.
void ShapeFromHfDir(json& model, const std::string& path, Resolution& r) {
  json keys, notes = json::object();
  const nn::ModelFamily* family = nullptr;
  try {
    const json hf = nn::ReadHfConfig(path);
    if (hf.contains("quantization_config")) {
      const json& q = hf["quantization_config"];
      r.problems.push_back(StrCat(
          "model.init_from: '", path, "/config.json' has a quantization_config (",
          q.is_object() ? q.value("quant_method", json("?")).dump() : q.dump(),
          "): its weights are stored quantized, which ztrain does not read; give the "
          "unquantized checkpoint and a `quantization` section (ztrain quantizes while loading, "
          "as bitsandbytes does)"));
      return;
    }
    family = &nn::FindHfFamily(hf, path + "/config.json");
    keys = family->hf.read_config(hf, path + "/config.json", &notes);
  } catch (const Error& e) {
    r.problems.push_back(StrCat("model.init_from: ", e.what()));
    return;
  }
  json taken = json::object();
  TakeModelKeys(model, keys, "", path, "the model directory sets it", taken, r);
  if (taken.empty()) return;
  // The values the run takes from the file as they are (not derived, as a sliding window is).
  for (const auto& [ours, theirs] : family->hf.config_keys) {
    if (taken.contains(ours) && !notes.contains(ours)) {
      r.sources.push_back({"model." + ours, StrCat(path, "/config.json: ", theirs)});
    }
  }
  std::string why = StrCat("from the config.json of model.init_from '", path, "'");
  for (const auto& [key, note] : notes.items()) {
    why += StrCat("; ", key, " from ", note.get<std::string>());
  }
  r.choices.push_back({"model", taken, why});
}

// Step 1 of Note [A run's config].
void ShapeFromModelFile(json& j, Resolution& r) {
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) return;
  json& model = j["model"];
  const json init = model.value("init_from", json(""));
  if (!init.is_string() || init.get<std::string>().empty()) return;
  const std::string path = init.get<std::string>();
  if (nn::NamesHfModelDir(path)) {
    ShapeFromHfDir(model, path, r);
    return;
  }
  ModelConfig file;
  try {
    file = nn::ReadLlmcModelHeader(path);
  } catch (const Error& e) {
    r.problems.push_back(StrCat("model.init_from: ", e.what(),
                                "; give an llm.c model file or a Hugging Face model directory "
                                "(ztrain's training.save_final writes either) or remove the "
                                "key to start from random weights"));
    return;
  }
  const json type = model.value("type", json("auto"));
  if (type != "auto" && type != "gpt2") {
    r.problems.push_back(StrCat("model.type: the config says ", type.dump(),
                                " but model.init_from '", path,
                                "' is an llm.c model file, which holds GPT-2; give a Hugging "
                                "Face model directory for other families"));
    return;
  }
  const json keys = {{"n_layer", file.n_layer},         {"n_head", file.n_head},
                     {"n_embd", file.n_embd},           {"vocab_size", file.vocab_size},
                     {"padded_vocab_size", file.padded_vocab_size},
                     {"max_seq_len", file.max_seq_len}};
  json taken = json::object();
  TakeModelKeys(model, keys, "", path, "the file sets the shape", taken, r);
  if (!taken.empty()) {
    r.choices.push_back(
        {"model", taken, StrCat("from the header of model.init_from '", path, "'")});
  }
}

// The bf16 section as the schema reads it: "bf16", or DeepSpeed's older "bfloat16".
json* Bf16Section(json& j) {
  if (j.contains("bf16")) return &j["bf16"];
  if (j.contains("bfloat16")) return &j["bfloat16"];
  return nullptr;
}

// A rank's share of its device's memory, and its description for the reason.
int64_t MemoryBudget(const DeviceChoice& device, const LaunchEnv& launch, std::string* what) {
  if (!device.device.is_cpu()) {
    const kernels::CudaDeviceInfo info = kernels::GetCudaDeviceInfo(device.device.index);
    *what = StrCat(FormatBytes(info.total_bytes), " of ", device.device.ToString(), " (", info.name,
                   ")");
    return static_cast<int64_t>(kAutoMemoryShare * static_cast<double>(info.total_bytes));
  }
  const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  const int64_t ranks = std::max(1, launch.local_size);
  *what = StrCat(FormatBytes(physical / ranks), ", this rank's share of the node's ",
                 FormatBytes(physical), ranks > 1 ? StrCat(" (", ranks, " ranks)") : "");
  return static_cast<int64_t>(kAutoMemoryShare * static_cast<double>(physical / ranks));
}

// The estimated peaks of `j` in fp32 and in bf16 at its micro-batch (1 where it is "auto");
// zeros where the config has problems (step 3 names them).
Bf16Memory EstimateBothPrecisions(const json& j, int world_size, const DeviceChoice& device,
                                  const LaunchEnv& launch) {
  Bf16Memory m;
  m.budget = MemoryBudget(device, launch, &m.memory);
  for (const bool bf16 : {false, true}) {
    json probe_json = j;
    (*Bf16Section(probe_json))["enabled"] = bf16;
    if (probe_json.value("train_micro_batch_size_per_gpu", json()) == "auto") {
      probe_json["train_micro_batch_size_per_gpu"] = 1;
    }
    Config probe;
    if (!ConfigProblems(probe_json, world_size, &probe).empty()) return Bf16Memory{};
    probe.device = device.device.ToString();
    (bf16 ? m.bf16_peak : m.fp32_peak) = EstimateMemory(probe).device_total_peak;
  }
  return m;
}

void ResolveBf16(json& j, const DeviceChoice& device, int world_size, const LaunchEnv& launch,
                 Resolution& r) {
  json* section = Bf16Section(j);
  if (!section || !section->is_object() || section->value("enabled", json()) != "auto") return;
  const bool fp16 = j.contains("fp16") && j["fp16"].is_object() &&
                    j["fp16"].value("enabled", json(false)) == true;
  bool bf16 = false;
  std::string why;
  if (fp16) {
    why = "fp16.enabled is true";
  } else if (device.device.is_cpu()) {
    // Note [bf16 where it pays]: measured on the model's own MLP GEMM.
    const json model = j.value("model", json::object());
    const json width = model.value("n_embd", json(768)), mlp = model.value("intermediate_size", json(0));
    const int64_t c = width.is_number_integer() ? width.get<int64_t>() : 768;
    const int64_t m = mlp.is_number_integer() && mlp.get<int64_t>() > 0 ? mlp.get<int64_t>() : 4 * c;
    bf16 = kernels::Bf16Pays(kernels::MeasureBf16Speed(c, m), &why);
    why = "the CPU backend: " + why;
  } else {
    const kernels::CudaDeviceInfo info = kernels::GetCudaDeviceInfo(device.device.index);
    bf16 = info.major >= 8;
    why =
        StrCat(device.device.ToString(), " (", info.name, ") has compute capability ", info.major,
               ".", info.minor, bf16 ? ": bf16 tensor cores" : ", below 8.0: no bf16 tensor cores");
  }
  if (!fp16 && !bf16 && device.device.is_cpu()) {  // a GPU below 8.0 has no bf16 GEMMs to fall to
    bf16 = Bf16ForTheRun(false, why, EstimateBothPrecisions(j, world_size, device, launch), &why);
  }
  (*section)["enabled"] = bf16;
  r.choices.push_back({"bf16.enabled", bf16, why});
}

// The largest micro-batch one batch of the training and validation data allows (the loader's
// rules in data/data_loader.h), so that "auto" never picks one the data cannot fill.
int64_t LargestDataBatch(const Config& c) {
  int64_t largest = INT64_MAX;
  for (data::Split split : {data::Split::kTrain, data::Split::kVal}) {
    // A mixture takes any batch: its datasets' windows repeat as epochs (Note [Data mixture]).
    if (split == data::Split::kTrain && !c.data.train_mixture.empty()) continue;
    const auto source = data::OpenDataSource(c.data, split, c.model.vocab_size, c.training.seed);
    if (!source) continue;
    int64_t tokens = INT64_MAX, windows = 0;
    for (int64_t s = 0; s < source->num_shards(); ++s) {
      const int64_t size = static_cast<int64_t>(source->shard(s).size());
      tokens = std::min(tokens, size);
      windows += (size - 1) / c.data.seq_len;
    }
    const bool shuffled = split == data::Split::kTrain && c.data.shuffle;
    const int64_t per_batch = shuffled ? windows : (tokens - 1) / c.data.seq_len;
    largest = std::min(largest, per_batch / std::max(1, c.dp_size));
  }
  return std::max<int64_t>(1, largest);
}

void ResolveMicroBatch(json& j, int world_size, const DeviceChoice& device, const LaunchEnv& launch,
                       Resolution& r) {
  if (j.value("train_micro_batch_size_per_gpu", json()) != "auto") return;
  const json batch = j.value("train_batch_size", json());
  if (!batch.is_null() && batch != "auto") return;  // derived from it by the batch rules
  j["train_micro_batch_size_per_gpu"] = 1;          // what the estimate starts from
  Config probe;
  if (!ConfigProblems(j, world_size, &probe).empty()) return;  // step 3 names them
  probe.device = device.device.ToString();
  std::string memory;
  const int64_t budget = MemoryBudget(device, launch, &memory);
  int64_t cap = kMaxAutoMicroBatch;
  try {
    cap = std::min(cap, LargestDataBatch(probe));
  } catch (const Error&) {
    // The data is named by the loader (and check-config's preflight); tune as if unlimited.
  }
  const TuneResult t = TuneMicroBatch(probe, budget, cap, /*confirm=*/false);
  if (t.micro_batch == 0) {
    r.problems.push_back(
        StrCat("train_micro_batch_size_per_gpu: \"auto\" finds no micro-batch that fits ",
               FormatBytes(budget), " (90 % of ", memory, "): micro-batch 1 needs ",
               FormatBytes(t.tried.empty() ? 0 : t.tried.front().second),
               " by the estimate; use a higher ZeRO stage, offload or activation checkpointing "
               "(ztrain estimate shows each), or fewer ranks per node"));
    return;
  }
  j["train_micro_batch_size_per_gpu"] = t.micro_batch;
  r.choices.push_back({"train_micro_batch_size_per_gpu", t.micro_batch,
                       StrCat("the largest whose estimated peak (", FormatBytes(t.estimated_peak),
                              ") fits 90 % of ", memory,
                              t.micro_batch == cap && cap < kMaxAutoMicroBatch
                                  ? StrCat(", and that one batch of the data allows")
                                  : "",
                              ", as ztrain tune finds it")});
}

// Step 2 of Note [A run's config].
void HardwareAutos(json& j, int world_size, const LaunchEnv& launch, Resolution& r) {
  if (!j.is_object()) return;
  json* bf16 = Bf16Section(j);
  const bool bf16_auto = bf16 && bf16->is_object() && bf16->value("enabled", json()) == "auto";
  if (!bf16_auto && j.value("train_micro_batch_size_per_gpu", json()) != "auto") return;
  const json setting = j.value("device", json("auto"));
  if (!setting.is_string()) return;  // ParseConfig names the type
  DeviceChoice device;
  try {
    LaunchEnv env = launch;
    if (env.launcher == "none") env.world_size = world_size;
    device = SelectDevice(setting.get<std::string>(), env);
  } catch (const Error& e) {
    r.problems.push_back(StrCat("device: ", e.what(),
                                " (needed to resolve the \"auto\"s that "
                                "depend on the device)"));
    return;
  }
  ResolveBf16(j, device, world_size, launch, r);
  ResolveMicroBatch(j, world_size, device, launch, r);
}

// A 0 the user (or model.init_from's file) wrote for a size that "auto" derives: no model has
// it. Resolved configs never hold one (core/config_resolve.cc), though ParseConfig still reads
// the 0 of older checkpoints' configs as "auto".
std::vector<std::string> ZeroSizes(const json& j) {
  std::vector<std::string> problems;
  const json* model = j.is_object() && j.contains("model") ? &j["model"] : nullptr;
  if (model == nullptr || !model->is_object()) return problems;
  for (const auto& [key, meaning] : {std::pair{"n_kv_head", "model.n_head"},
                                     {"head_dim", "model.n_embd / model.n_head"},
                                     {"intermediate_size", "4 model.n_embd"}}) {
    const json v = model->value(key, json());
    if (v.is_number_integer() && v.get<int64_t>() == 0) {
      problems.push_back(StrCat("model.", key, ": must be >= 1, got 0 (\"auto\", or leaving it "
                                "out, gives ", meaning, ")"));
    }
  }
  return problems;
}

}  // namespace

bool Bf16ForTheRun(bool fast, const std::string& speed_why, const Bf16Memory& m, std::string* why) {
  const bool fp32_fits = m.fp32_peak <= m.budget, bf16_fits = m.bf16_peak <= m.budget;
  if (fast || m.fp32_peak == 0 || fp32_fits || !bf16_fits) {
    *why = speed_why;
    if (!fast && m.fp32_peak > 0 && !fp32_fits) {
      *why += StrCat("; in bf16 it would not fit either (", FormatBytes(m.bf16_peak),
                     " by the estimate, more than 90 % of ", m.memory, ")");
    }
    return fast;
  }
  *why = StrCat("only bf16 fits: the fp32 run needs ", FormatBytes(m.fp32_peak),
                " by the estimate, more than ", FormatBytes(m.budget), " (90 % of ", m.memory,
                "), the bf16 run ", FormatBytes(m.bf16_peak),
                " (bf16 does not pay for speed here: ", speed_why, ", but it runs)");
  return true;
}

Config ResolveRunConfig(json j, int world_size, const LaunchEnv& launch) {
  Resolution r;
  ShapeFromModelFile(j, r);
  LoraFromAdapterDir(j, r);
  HardwareAutos(j, world_size, launch, r);
  Config config;
  std::vector<std::string> problems = ConfigProblems(j, world_size, &config);
  for (std::string& zero : ZeroSizes(j)) problems.push_back(std::move(zero));
  if (problems.empty()) {  // what the model's family refuses, as building it would
    try {
      nn::CheckModel(config.model);
      if (config.tensor_parallel_size > 1) {
        nn::CheckTensorParallelModel(config.model, config.tensor_parallel_size);
      }
    } catch (const ConfigError& e) {  // one problem a line
      std::istringstream lines(e.what());
      for (std::string line; std::getline(lines, line);) problems.push_back("model: " + line);
    }
  }
  if (problems.empty() && config.lora.enabled) {  // what the adapter plan refuses
    try {
      const nn::AdapterPlan plan(config);
      nn::BuildModel(config.model, nn::MakeWholeLinears(), plan);
      const std::vector<std::string> unmatched = plan.UnmatchedSkipModules();
      if (config.quantization.enabled() && !unmatched.empty() && launch.rank == 0) {
        std::string list;
        for (const std::string& u : unmatched) list += (list.empty() ? "'" : ", '") + u + "'";
        Log().warn(
            "quantization.llm_int8_skip_modules: {} matched no linear of the blocks, so "
            "it keeps nothing unquantized (the names are Hugging Face module names, "
            "e.g. q_proj, mlp, layers.0.self_attn)",
            list);
      }
    } catch (const ConfigError& e) {
      problems.push_back(e.what());
    }
  }
  for (std::string& p : problems) p = InTheirWords(p, r);  // not the resolution's own
  problems.insert(problems.begin(), r.problems.begin(), r.problems.end());
  if (!problems.empty()) throw InvalidConfig(problems);
  config.auto_choices.insert(config.auto_choices.begin(), r.choices.begin(), r.choices.end());
  return config;
}

Config LoadRunConfig(const std::string& path, int world_size, const LaunchEnv& launch) {
  if (path.empty()) return ResolveRunConfig(DefaultConfigJson(), world_size, launch);
  const json j = ReadConfigJson(path);
  try {
    return ResolveRunConfig(j, world_size, launch);
  } catch (const ConfigError& e) {
    throw ConfigError(StrCat("config file ", path, ": ", e.what()));
  }
}

}  // namespace ztrain
