#pragma once
// What a command writes, made whole before anyone sees it, and never onto what it reads.
//
// Note [Staged outputs]: an output (a directory of files, or one file) is written under a
// staging name beside it, `<parent>/.<name>.ztrain-staging.<host>.<pid>`, and renamed into
// place by Commit() only when whole. When the output already exists, Commit() exchanges the
// two names in one step (renameat2 RENAME_EXCHANGE; where the file system lacks it, a rename
// of the old aside and of the new into place, with the old put back if the second fails) and
// then removes the old content. So a SIGKILL, a full disk or any error at any moment leaves
// the previous output as it was (or nothing, if there was none), plus at most a staging
// directory, which the next StagedOutput for the same path removes when its process is gone
// (and names when it belongs to a live process or another host).
//
// An existing output that holds anything is replaced only with `overwrite` (the CLI's
// --overwrite); otherwise the constructor refuses it, naming what is there. Errors:
// ConfigError for a refused output, IoError naming the path and the OS error. Not thread
// safe; one object per output.
#include <string>
#include <utility>
#include <vector>

namespace ztrain {

class StagedOutput {
 public:
  enum class Kind { kDirectory, kFile };

  // `out`: the final path; `what` names it in errors ("--out"). Checks `out` against
  // `overwrite`, cleans leftovers of killed runs and creates the staging path (a directory
  // for kDirectory; for kFile nothing is created, path() is where to write it).
  StagedOutput(std::string out, Kind kind, bool overwrite, std::string what);
  // Removes the staging path unless Commit() succeeded (destructors never throw).
  ~StagedOutput();
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;

  // Where to write: the staging directory, or the staging file's path.
  const std::string& path() const { return staging_; }
  const std::string& out() const { return out_; }
  // Puts the staged output in place of `out` (Note above).
  void Commit();

  // The staging names of `out` left by runs that were killed (for tests and messages).
  static std::vector<std::string> Leftovers(const std::string& out);

 private:
  std::string out_;    // as given, for messages
  std::string final_;  // absolute, normalized: where Commit() puts the output
  std::string staging_, what_;
  Kind kind_;
  bool committed_ = false;
};

// A file or directory a command reads, named for messages ("model.init_from").
struct NamedInput {
  std::string what, path;
};

// Throws ConfigError when `out` (not necessarily existing) is one of `inputs`, lies inside
// one, or contains one, judged by the identity of the files (device and inode, through
// symbolic links and `..`), not by spelling: writing there could replace what the command
// reads. `what` names the output ("--out"). Inputs that do not exist are skipped.
void CheckOutputIsNoInput(const std::string& out, const std::string& what,
                          const std::vector<NamedInput>& inputs);

}  // namespace ztrain
