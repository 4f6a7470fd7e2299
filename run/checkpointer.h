#pragma once
// Checkpointer: saving and resuming whole runs across all ranks (checkpoint/checkpoint.h for the
// files, Note [Checkpoints in the engine] for what each rank writes and reads).
//
// Save(step, data position) is collective over the world: rank 0 makes
// <dir>/step<N>.partial/, every rank writes its rank file into it, rank 0 gathers the files'
// sizes and checksums, writes meta.json, renames the directory to step<N>, points `latest`
// at it and removes old checkpoints beyond checkpoint.keep_last. If any rank fails, every
// rank throws and `latest` still names the previous checkpoint.
//
// The directory is locked for the Checkpointer's lifetime (rank 0 holds checkpoint::
// LockDirectory's DirLock), so a second live run with the same checkpoint.dir is refused at once,
// naming the run that holds it; a killed run leaves no stale lock.
//
// Resume(tag) is collective too: "latest" (or "") resumes from what `latest` names, checking
// every rank file's size and checksum first (the ranks share the files between them); a
// corrupt or incomplete checkpoint is reported by name and the newest intact one is used
// instead, saying so; with no checkpoint at all yet (the first launch of a job that always
// resumes) the run starts from step 0, saying so. A named step ("step20" or "20") is used as
// is or fails. The engine's
// state is then read from the files in its own layout, whatever layout wrote them.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/dir_lock.h"
#include "data/data_loader.h"
#include "engine/engine.h"
#include "parallel/comm/communicator.h"

namespace ztrain {

struct ResumePoint {
  int64_t step = 0;        // the last step the checkpoint's run took
  data::LoaderState data;  // where its next batch starts
  std::string directory;   // the checkpoint used; empty when there was none to resume
};

class Checkpointer {
 public:
  // `world`: every rank of the job (not owned), null for one process.
  Checkpointer(const Config& config, Engine& engine, comm::Communicator* world);
  ~Checkpointer();

  void Save(int64_t step, const data::LoaderState& data);
  // `required`: a checkpoint.dir without any checkpoint is a ConfigError (an explicit
  // --resume), not a start from step 0.
  ResumePoint Resume(const std::string& tag, bool required = false);
  // For a run that starts from step 0 (did not resume): ConfigError when checkpoint.dir holds
  // checkpoints of another model (shape or LoRA adapters differ: this run's saves and pruning
  // would replace them), naming them; a warning when it holds this model's (they are replaced
  // as this run saves its own steps; --resume continues them instead).
  void CheckFreshStart() const;
  const std::string& root() const { return root_; }

 private:
  // True on every rank when `ok` is true on every rank.
  bool AllOk(bool ok);
  // Every rank's `message` (up to 255 bytes), on every rank.
  std::vector<std::string> GatherMessages(const std::string& message);
  // "saved: step10, step20; latest: step20", for messages.
  std::string SavedSteps() const;
  // A saved resolved config against this run's (Note [Config changes on resume]): the
  // changes of the model's shape, of its LoRA adapter set, and the others ("path saved -> now").
  struct ConfigDiff {
    std::vector<std::string> shape, adapters, changed;
  };
  ConfigDiff Diff(const nlohmann::json& saved) const;
  // ConfigError for a changed model shape or adapter set, a warning naming every other change.
  void CheckConfigAgainst(const nlohmann::json& meta, const std::string& dir) const;

  const Config& config_;
  Engine& engine_;
  std::unique_ptr<comm::Communicator> self_;
  comm::Communicator* world_;
  std::string root_;
  std::unique_ptr<DirLock> lock_;  // rank 0: checkpoint.dir is this run's
};

}  // namespace ztrain
