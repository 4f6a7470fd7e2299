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
#include <functional>
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

// Note [Staged file sets]: files that belong together but lie beside other files in one
// directory (a corpus's shards, its validation shards and manifest: Note [Corpus shards]) can
// not be swapped in one rename. They are written into a staging directory named as above for
// the set's `out`, and Commit() first writes a journal into it (`.ztrain-commit`, atomically:
// the names to put in place, in order, and the names of the earlier set to remove), then
// renames each file into place and removes the earlier set's other files. Once the journal
// exists the commit is decided: a run killed in the middle leaves a directory that mixes the
// two sets, and the next StagedOutput or StagedFileSet for the same `out` finishes that commit
// from the journal (each step can be repeated) before anything else; until then
// CheckNoUnfinishedCommit refuses to read the mixed files (the training data loader calls it).
// Killed before the journal, the staging directory is removed and the earlier set is untouched.
class StagedFileSet {
 public:
  // `out`: the set's main path (`dir/name`); the set's files go into its directory.
  // `earlier(filename)`: whether a file of that directory belongs to an earlier set of this
  // name (those the new set does not replace are removed at Commit). Finishes an interrupted
  // commit for `out`, removes killed runs' staging, and creates this run's staging directory.
  StagedFileSet(std::string out, std::function<bool(const std::string&)> earlier, std::string what);
  ~StagedFileSet();
  StagedFileSet(const StagedFileSet&) = delete;
  StagedFileSet& operator=(const StagedFileSet&) = delete;

  // Where the file named `name` (a plain file name) is written before the commit.
  std::string PathOf(const std::string& name) const;
  // Puts the files `names` (all written, in this order) in place and removes the earlier set's
  // others; returns the paths it removed.
  std::vector<std::string> Commit(const std::vector<std::string>& names);

  // Finishes or removes what killed runs left for `out` (as the constructor does) without
  // starting a new set.
  static void FinishInterrupted(const std::string& out);

 private:
  std::string out_, dir_, staging_, what_;
  std::function<bool(const std::string&)> earlier_;
  bool committed_ = false;
};

// Throws ConfigError when one of `files` is part of a set whose commit was interrupted (Note
// [Staged file sets]), naming the set and how to finish it. `what` names the files
// ("data.train").
void CheckNoUnfinishedCommit(const std::vector<std::string>& files, const std::string& what);

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
