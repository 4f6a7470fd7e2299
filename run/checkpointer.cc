#include "run/checkpointer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iterator>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/logging.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using ::ztrain::detail::StrCat;

constexpr int64_t kMessageBytes = 256;

// "step20", "20" or "latest"/"" -> the step, or -1 for latest.
int64_t ParseTag(const std::string& tag) {
  if (tag.empty() || tag == "latest") return -1;
  const std::string digits = tag.rfind("step", 0) == 0 ? tag.substr(4) : tag;
  ZTRAIN_CHECK_T(ConfigError,
                 !digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos,
                 "--resume takes 'latest', a step number or step<N>; got '", tag, "'");
  return std::stoll(digits);
}

// Note [GEMMs chosen by measurement]: the saved run's fp32 GEMM backends replace this run's
// measured ones, so that the resumed steps compute as the saved run's would have (a backend
// this build lacks falls back to OpenBLAS in the ops). Checkpoints of earlier versions have
// none: the measured plan stays. Every rank reads the same meta.json, so all take the same.
void RestoreGemmPlan(Engine& engine, const nlohmann::json& saved, const std::string& dir) {
  if (!saved.is_string()) return;
  kernels::GemmPlan plan;
  try {
    plan = kernels::GemmPlan::FromText(saved.get<std::string>());
  } catch (const Error& e) {
    Log().warn(
        "checkpoint {}: its gemm_plan does not read ({}); keeping this run's GEMM "
        "choices, so the resumed steps may differ from the saved run's in the last bits",
        dir, e.what());
    return;
  }
  if (plan == engine.gemm_plan()) return;
  Log().info(
      "fp32 GEMMs: the backends of checkpoint {} (oneDNN on {} of its {} shapes) replace "
      "this run's measured ones, so that the resumed run computes as the saved one",
      dir,
      plan.OnOneDnn(), plan.choices().size());
  engine.UseGemmPlan(plan);
}

}  // namespace

Checkpointer::Checkpointer(const Config& config, Engine& engine, comm::Communicator* world)
    : config_(config),
      engine_(engine),
      self_(world ? nullptr : comm::MakeSelfCommunicator()),
      world_(world ? world : self_.get()),
      root_(config.checkpoint.dir) {
  ZTRAIN_CHECK_T(ConfigError, !root_.empty(),
                 "checkpoints need checkpoint.dir: set it to a directory every rank can reach");
  std::string error;
  if (world_->rank() == 0) {
    try {
      lock_ = checkpoint::LockDirectory(root_, config.training.job_name);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const std::string first = GatherMessages(error)[0];
  if (!first.empty()) throw ConfigError(first);
}

Checkpointer::~Checkpointer() = default;

bool Checkpointer::AllOk(bool ok) {
  int32_t failed = ok ? 0 : 1;
  world_->AllReduce(Tensor(&failed, DType::kI32, {1}))->Wait();
  return failed == 0;
}

std::vector<std::string> Checkpointer::GatherMessages(const std::string& message) {
  return comm::AllGatherText(*world_, message, kMessageBytes);
}

void Checkpointer::Save(int64_t step, const data::LoaderState& data) {
  const auto start = std::chrono::steady_clock::now();
  const int rank = world_->rank(), n = world_->size();
  const std::string name = checkpoint::StepName(step);
  const std::string partial = root_ + "/" + name + ".partial";
  std::string error;
  if (rank == 0) {
    try {
      std::error_code ec;
      fs::create_directories(root_, ec);
      fs::remove_all(partial, ec);
      ZTRAIN_CHECK_T(IoError, fs::create_directory(partial, ec), "cannot create ", partial, ": ",
                     ec.message(), "; check checkpoint.dir");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!AllOk(error.empty())) {
    throw IoError(StrCat("checkpoint ", name, " was not saved: ", GatherMessages(error)[0]));
  }
  // Every rank's file: its bytes and checksum, or an error.
  int64_t bytes = 0;
  uint32_t crc = 0;
  try {
    checkpoint::ShardWriter writer(partial + "/" + checkpoint::RankFileName(rank));
    engine_.SaveState(writer);
    const checkpoint::ShardWriter::Result r = writer.Finish();
    bytes = r.bytes;
    crc = r.crc;
  } catch (const std::exception& e) {
    error = StrCat("rank ", rank, ": ", e.what());
  }
  std::vector<int64_t> mine = {error.empty() ? 0 : 1, bytes, static_cast<int64_t>(crc)};
  std::vector<int64_t> all(static_cast<size_t>(3 * n));
  world_
      ->AllGather(Tensor(reinterpret_cast<int32_t*>(mine.data()), DType::kI32, {6}),
                  Tensor(reinterpret_cast<int32_t*>(all.data()), DType::kI32, {6 * n}))
      ->Wait();
  const std::vector<std::string> errors = GatherMessages(error);
  for (int r = 0; r < n; ++r) {
    if (all[static_cast<size_t>(3 * r)] != 0) {
      if (rank == 0) {
        std::error_code ec;
        fs::remove_all(partial, ec);
      }
      throw IoError(StrCat("checkpoint ", name, " was not saved: ", errors[static_cast<size_t>(r)],
                           "; the previous checkpoint stays latest"));
    }
  }
  int64_t total = 0;
  if (rank == 0) {
    try {
      nlohmann::json files = nlohmann::json::array();
      for (int r = 0; r < n; ++r) {
        total += all[static_cast<size_t>(3 * r + 1)];
        files.push_back({{"name", checkpoint::RankFileName(r)},
                         {"bytes", all[static_cast<size_t>(3 * r + 1)]},
                         {"crc32c", static_cast<uint32_t>(all[static_cast<size_t>(3 * r + 2)])}});
      }
      const nlohmann::json meta = {
          {"format", "ztrain-checkpoint"},
          {"version", checkpoint::kCheckpointVersion},
          {"step", step},
          {"files", files},
          {"data",
           {{"epoch", data.epoch},
            {"shard", data.shard},
            {"position", data.position},
            {"mixture", data.mixture}}},
          {"layout",
           {{"world", n},
            {"dp", engine_.dp_size()},
            {"pp", engine_.pp_size()},
            {"tp", engine_.tp_size()},
            {"zero_stage", config_.zero.stage},
            {"offload_param", config_.zero.offload_param.device},
            {"offload_optimizer", config_.zero.offload_optimizer.device}}},
          // The lr schedule is a function of the step; the data order of (seed, epoch): no
          // other random state exists. fp16's loss scaler (null without fp16).
          {"scheduler", {{"type", config_.scheduler.type}, {"step", step}}},
          {"rng", {{"seed", config_.training.seed}}},
          {"loss_scaler", engine_.LossScalerState()},
          {"gemm_plan", engine_.gemm_plan().ToText()},
          {"config", config_.resolved}};
      checkpoint::WriteMeta(partial, meta);
      const std::string final_dir = root_ + "/" + name;
      std::error_code ec;
      if (fs::exists(final_dir)) {  // saved again at the same step (after a resume)
        fs::rename(final_dir, final_dir + ".old.partial", ec);
      }
      ZTRAIN_CHECK_T(IoError, ::rename(partial.c_str(), final_dir.c_str()) == 0, "cannot rename ",
                     partial, " to ", final_dir, ": ", std::strerror(errno));
      checkpoint::SyncDirectory(root_);
      checkpoint::WriteLatest(root_, step);
      checkpoint::Prune(root_, static_cast<int>(config_.checkpoint.keep_last),
                        [this](const nlohmann::json& saved_meta) {
                          const ConfigDiff d = Diff(saved_meta.value("config", nlohmann::json()));
                          return d.shape.empty() && d.adapters.empty();
                        });
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!AllOk(error.empty())) {
    throw IoError(StrCat("checkpoint ", name, " was not saved: ", GatherMessages(error)[0]));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Log().info("saved checkpoint {}/{} ({} in {:.2f} s, {:.2f} GB/s)", root_, name,
             FormatBytes(total), seconds, static_cast<double>(total) / seconds * 1e-9);
}

ResumePoint Checkpointer::Resume(const std::string& tag, bool required) {
  const int64_t wanted = ParseTag(tag);
  std::vector<int64_t> candidates;
  if (wanted >= 0) {
    ZTRAIN_CHECK_T(IoError, fs::exists(root_ + "/" + checkpoint::StepName(wanted)),
                   "there is no checkpoint ", checkpoint::StepName(wanted), " in ", root_,
                   ": that step was never saved (", SavedSteps(),
                   "); resume from one of "
                   "those, or from latest");
    candidates.push_back(wanted);
  } else {
    std::string latest_problem;
    candidates = checkpoint::ResumeCandidates(root_, &latest_problem);
    if (!latest_problem.empty()) {
      Log().warn("{}; {}", latest_problem,
                 candidates.empty() ? "and there is no checkpoint to fall back to"
                                    : "falling back to the newest intact checkpoint, " +
                                          checkpoint::StepName(candidates[0]));
    }
    ZTRAIN_CHECK_T(ConfigError, !candidates.empty() || !required,
                   checkpoint::NothingToResume(root_));
    if (candidates.empty()) {  // a first launch of a job that always resumes: start afresh
      Log().warn("no checkpoint in {} yet: starting from step 0", root_);
      return ResumePoint{};
    }
  }
  for (size_t c = 0; c < candidates.size(); ++c) {
    const std::string dir = root_ + "/" + checkpoint::StepName(candidates[c]);
    std::string error;
    nlohmann::json meta;
    try {
      meta = checkpoint::ReadMeta(dir);
      // The ranks share the files: rank r checks files r, r + world, ...
      error = checkpoint::VerifyFiles(dir, meta, world_->rank(), world_->size());
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!AllOk(error.empty())) {
      std::string first;
      for (const std::string& m : GatherMessages(error)) {
        if (first.empty() && !m.empty()) first = m;
      }
      const std::string what = StrCat("checkpoint ", dir, " is not intact: ", first);
      if (wanted >= 0) throw IoError(what + "; pick another step or resume from latest");
      if (c + 1 < candidates.size()) {
        Log().warn("{}; falling back to {}", what, checkpoint::StepName(candidates[c + 1]));
        continue;
      }
      throw IoError(what + "; no intact checkpoint is left in " + root_);
    }
    CheckConfigAgainst(meta, dir);
    checkpoint::ModelIndex index(dir, meta);
    const int64_t step = meta.at("step");
    engine_.LoadState(index, step);
    engine_.RestoreLossScaler(meta.value("loss_scaler", nlohmann::json()));
    RestoreGemmPlan(engine_, meta.value("gemm_plan", nlohmann::json()), dir);
    ResumePoint point;
    point.step = step;
    point.directory = dir;
    const nlohmann::json& d = meta.at("data");
    point.data = data::LoaderState{d.at("epoch"), d.at("shard"), d.at("position"),
                                   d.value("mixture", false)};
    const nlohmann::json& layout = meta.at("layout");
    Log().info("resumed from {} (step {}, saved by {} ranks: dp {} x pp {} x tp {}, ZeRO stage {})",
               dir, step, layout.at("world").get<int>(), layout.at("dp").get<int>(),
               layout.at("pp").get<int>(), layout.at("tp").get<int>(),
               layout.at("zero_stage").get<int>());
    return point;
  }
  throw IoError("unreachable");
}

void Checkpointer::CheckFreshStart() const {
  std::vector<std::string> others, ours;
  for (int64_t s : checkpoint::ListSteps(root_)) {
    const std::string name = checkpoint::StepName(s);
    try {
      const ConfigDiff d =
          Diff(checkpoint::ReadMeta(root_ + "/" + name).value("config", nlohmann::json()));
      if (d.shape.empty() && d.adapters.empty()) {
        ours.push_back(name);
        continue;
      }
      const std::string first = d.shape.empty() ? d.adapters[0] : d.shape[0];
      others.push_back(StrCat(name, " (", first, ")"));
    } catch (const std::exception&) {
      ours.push_back(name);  // unreadable: nothing of it can be lost to a load
    }
  }
  if (!others.empty()) {
    std::string list;
    for (const std::string& o : others) list += "\n  " + o;
    throw ConfigError(StrCat(
        "checkpoint.dir '", root_, "' holds checkpoints of another model (saved -> this config):",
        list,
        "\nthis run would save over them; choose another checkpoint.dir, or resume them with "
        "the config they were saved with"));
  }
  if (!ours.empty() && world_->rank() == 0) {
    Log().warn("checkpoint.dir {} holds checkpoints of an earlier run of this model ({}); this "
               "run starts from step 0 and replaces them as it saves; --resume (or "
               "checkpoint.resume) continues them instead",
               root_, SavedSteps());
  }
}

std::string Checkpointer::SavedSteps() const {
  const std::vector<int64_t> steps = checkpoint::ListSteps(root_);
  if (steps.empty()) return "none is saved yet";
  std::string list;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    list += (list.empty() ? "" : ", ") + checkpoint::StepName(*it);
  }
  const int64_t latest = checkpoint::ReadLatest(root_);
  return StrCat("saved: ", list, latest >= 0 ? "; latest: " + checkpoint::StepName(latest) : "");
}

// Note [Config changes on resume]: the resolved config the checkpoint was saved with against
// this run's. A change of the model's shape cannot load (refused, naming both values); nor can
// a change of which LoRA adapters exist and how large they are (lora.enabled, r,
// target_modules, layers_to_transform, modules_to_save, bias): it would drop trained adapters
// or reshape them, so it is refused with the way to keep them (export the adapter, start a
// new run from it with lora.init_from). Any other change (data, seq_len, seed, batch, lr,
// lora_dropout, layout...) is legitimate but changes what the run trains, so each is named in
// one warning. training.steps (extending a run), the checkpoint section and the init_from
// keys (the resumed state replaces them) are not changes. The same comparison keeps pruning
// off the checkpoints of another model in the same checkpoint.dir (Checkpointer::Save).
namespace {

constexpr const char* kShapeKeys[] = {
    "model.type",        "model.n_layer",           "model.n_head",      "model.n_embd",
    "model.vocab_size",  "model.padded_vocab_size", "model.max_seq_len", "model.n_kv_head",
    "model.head_dim",    "model.intermediate_size"};

// A size as the model has it: checkpoints of older versions saved "auto" sizes as 0, which
// ModelConfig's accessors read as following n_head and n_embd; the same accessors decide here.
nlohmann::json EffectiveSize(const nlohmann::json& config, const std::string& path,
                             const nlohmann::json& v) {
  if (!v.is_number_integer() || v.get<int64_t>() != 0) return v;
  const nlohmann::json* heads = ConfigValue(config, "model.n_head");
  const nlohmann::json* embd = ConfigValue(config, "model.n_embd");
  if (!heads || !embd || !heads->is_number_integer() || !embd->is_number_integer()) return v;
  ModelConfig m;
  m.n_head = heads->get<int>();
  m.n_embd = embd->get<int>();
  if (path == "model.n_kv_head") return m.kv_heads();
  if (path == "model.head_dim") return m.head_size();
  if (path == "model.intermediate_size") return m.mlp_hidden();
  return v;
}
constexpr const char* kAdapterKeys[] = {"lora.enabled",           "lora.r",
                                        "lora.target_modules",    "lora.layers_to_transform",
                                        "lora.modules_to_save",   "lora.bias"};

template <size_t N>
bool Among(const char* const (&keys)[N], const std::string& path) {
  return std::find(std::begin(keys), std::end(keys), path) != std::end(keys);
}

}  // namespace

Checkpointer::ConfigDiff Checkpointer::Diff(const nlohmann::json& saved) const {
  static const nlohmann::json kAbsent;  // a section the config leaves out
  ConfigDiff diff;
  for (const std::string& path : ConfigValuePaths()) {
    if (path == "training.steps" || path == "model.init_from" || path == "lora.init_from" ||
        path.rfind("checkpoint.", 0) == 0) {
      continue;
    }
    const bool adapters = Among(kAdapterKeys, path);
    const nlohmann::json* before = ConfigValue(saved, path);
    const nlohmann::json* now = ConfigValue(config_.resolved, path);
    if (adapters && (before || now)) {  // a LoRA section removed or added counts
      if (!before) before = &kAbsent;
      if (!now) now = &kAbsent;
    }
    if (!before || !now || *before == *now) continue;
    if (EffectiveSize(saved, path, *before) == EffectiveSize(config_.resolved, path, *now)) continue;
    const std::string what = StrCat(path, " ", before->dump(), " -> ", now->dump());
    (Among(kShapeKeys, path) ? diff.shape : adapters ? diff.adapters : diff.changed).push_back(what);
  }
  return diff;
}

void Checkpointer::CheckConfigAgainst(const nlohmann::json& meta, const std::string& dir) const {
  const ConfigDiff diff = Diff(meta.value("config", nlohmann::json::object()));
  const auto lines_of = [](const std::vector<std::string>& lines) {
    std::string text;
    for (const std::string& l : lines) text += "\n  " + l;
    return text;
  };
  if (!diff.shape.empty()) {
    throw ConfigError(StrCat("cannot resume from ", dir,
                             ": the model's shape differs from the "
                             "one it was saved with (saved -> this config):",
                             lines_of(diff.shape),
                             "\na checkpoint loads only into the model it was saved from; set "
                             "these keys back, or start a new checkpoint.dir"));
  }
  if (!diff.adapters.empty()) {
    throw ConfigError(StrCat(
        "cannot resume from ", dir,
        ": its LoRA adapters were trained with another adapter set (saved -> this config):",
        lines_of(diff.adapters),
        "\nresuming would drop or reshape trained adapter weights. Set these keys back to "
        "resume; or keep what was trained and go on with other adapters: `ztrain export "
        "--checkpoint ",
        dir, " --format peft --out ADAPTER_DIR`, then start a new run (another "
        "checkpoint.dir) from it with lora.init_from: \"lora\": {\"init_from\": "
        "\"ADAPTER_DIR\", ...}"));
  }
  const std::vector<std::string>& changed = diff.changed;
  if (changed.empty() || world_->rank() != 0) return;
  std::string list;
  for (const std::string& c : changed) list += (list.empty() ? "" : "; ") + c;
  Log().warn("resuming from {} with {} config change{} since it was saved (saved -> now): {}", dir,
             changed.size(), changed.size() == 1 ? "" : "s", list);
}

}  // namespace ztrain
