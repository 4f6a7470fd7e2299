#include "engine/checkpointer.h"

#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/logging.h"
#include "engine/checkpoint.h"

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

}  // namespace

Checkpointer::Checkpointer(const Config& config, Engine& engine, comm::Communicator* world)
    : config_(config),
      engine_(engine),
      self_(world ? nullptr : comm::MakeSelfCommunicator()),
      world_(world ? world : self_.get()),
      root_(config.checkpoint.dir) {
  ZTRAIN_CHECK_T(ConfigError, !root_.empty(),
                 "checkpoints need checkpoint.dir: set it to a directory every rank can reach");
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
          {"version", 1},
          {"step", step},
          {"files", files},
          {"data", {{"epoch", data.epoch}, {"shard", data.shard}, {"position", data.position}}},
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
      checkpoint::Prune(root_, static_cast<int>(config_.checkpoint.keep_last));
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

ResumePoint Checkpointer::Resume(const std::string& tag) {
  const int64_t wanted = ParseTag(tag);
  std::vector<int64_t> candidates;
  if (wanted >= 0) {
    candidates.push_back(wanted);
  } else {
    const int64_t latest = checkpoint::ReadLatest(root_);
    if (latest >= 0) candidates.push_back(latest);
    for (int64_t s : checkpoint::ListSteps(root_)) {
      if (s != latest) candidates.push_back(s);
    }
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
    checkpoint::ModelIndex index(dir, meta);
    const int64_t step = meta.at("step");
    engine_.LoadState(index, step);
    engine_.RestoreLossScaler(meta.value("loss_scaler", nlohmann::json()));
    ResumePoint point;
    point.step = step;
    point.directory = dir;
    const nlohmann::json& d = meta.at("data");
    point.data = data::LoaderState{d.at("epoch"), d.at("shard"), d.at("position")};
    const nlohmann::json& layout = meta.at("layout");
    Log().info("resumed from {} (step {}, saved by {} ranks: dp {} x pp {} x tp {}, ZeRO stage {})",
               dir, step, layout.at("world").get<int>(), layout.at("dp").get<int>(),
               layout.at("pp").get<int>(), layout.at("tp").get<int>(),
               layout.at("zero_stage").get<int>());
    return point;
  }
  throw IoError("unreachable");
}

}  // namespace ztrain
