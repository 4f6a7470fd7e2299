#pragma once
// SwapDir: the directory of one rank's swap files, <nvme_path>/ztrain-<job>/rank<R>/.
//
// Made on construction, locked for the SwapDir's lifetime (DirLock), after checking that
// the file system has room for `needed_bytes` (the sum of the rank's swap files): a run that
// cannot fit fails before training with the bytes it needs, the bytes free and what it could
// reclaim, not halfway through. Files that a run killed earlier left in the rank directory
// are removed and count as free space; other ranks' directories that no live process holds
// are named with the command that removes them (Note [Stale swap directories]). The
// directory and its files are removed when the SwapDir is destroyed (normal exit, or an
// error unwinding), and the job directory too once no rank directory is left in it. Swap
// files hold nothing a later run needs: checkpoints are written elsewhere.
// Throws IoError when nvme_path is not a directory, when a live process (of this or another
// run) holds the rank directory, or when the space is short. Not thread safe.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace ztrain {
class DirLock;
struct LockHolder;
}  // namespace ztrain

namespace ztrain::offload {

// Note [Stale swap directories]
// A run that is killed (SIGKILL, OOM killer, node crash) leaves its swap files behind, and
// the next run of the same job would count them as used space. Each live SwapDir therefore
// holds a lock on <rank dir>/ztrain.lock (DirLock: an fcntl open-file-description lock
// in a file naming job, host, pid and start time) that the kernel drops when its process
// dies, however it dies. A directory whose lock nobody holds belongs to no live process;
// pids alone could not say so (they are reused, and mean nothing on another host). A file
// system without such locks is refused by name (point nvme_path at a local one).
// - The rank's own directory, when its lock is free, is reclaimed before the space check:
//   the free space is read, then the files in it are removed (one warning says how many,
//   how large and who left them) and count as free. Nothing else can be using them: a live
//   user would hold the lock, and this rank is about to write its own files there. When the
//   lock is held the run is refused, naming the holder: two runs with the same job name and
//   nvme_path would otherwise write the same swap files.
// - Other rank directories of the job are looked at only from rank `ranks` up: the ones
//   below belong to ranks of this run, which reclaim their own as they start (naming them
//   would race that start and tell the user to delete a directory about to be used). A
//   higher one that no live process holds (IsHeld asks without taking the lock, so looking
//   never makes a starting rank's own lock fail) was left by an earlier run with more ranks.
//   It is named, with its size and `rm -rf '<dir>'`, in the space error or else in a
//   warning (by every rank of the run that sees it), but not deleted: it is not this rank's.
//   A free lock is good evidence there but no proof (a rank of another run with this job
//   name may be between making the directory and locking it, and a network file system
//   mounted with local locks shows no other host's lock), several ranks of this run would
//   race to delete the same directory, and a wrong deletion costs a live run its state
//   where a named directory costs the user one command.
// - A directory below `ranks` that this run's rank of that number never sees (node-local
//   disks, and the ranks placed on other nodes than before) stays until that rank next runs
//   on its node.

// Note [Swap space per node]
// The ranks of one node put their swap directories on the same nvme_path, a node-local disk,
// so the space check is for the node: this rank's bytes times the ranks on the node
// (`ranks_on_node`; ZeRO gives every data-parallel rank the same shard, pipeline stages
// differ, and the largest stage decides as every rank checks), against the free space plus
// what the node's other live ranks of this run have already put there (their locked rank
// directories: a rank that started first has taken its share of the free space already).
// Each rank checks, so the run fails on every rank of a node that is short, before
// training, naming the total. Ranks on other nodes have other disks and do not count.

// Free bytes on the file system holding a path; FreeBytes (statvfs) unless a test fakes it.
using FreeBytesFunction = std::function<int64_t(const std::string& path)>;

class SwapDir {
 public:
  // Rank `rank` of a job of `ranks` ranks. `what` names the user of the space in errors,
  // e.g. "offload_param".
  // `ranks_on_node`: the ranks of this run on this node, which share its disk (Note [Swap
  // space per node]).
  SwapDir(const std::string& nvme_path, const std::string& job, int rank, int ranks,
          int64_t needed_bytes, const std::string& what, FreeBytesFunction free_bytes = {},
          int ranks_on_node = 1);
  ~SwapDir();
  SwapDir(const SwapDir&) = delete;
  SwapDir& operator=(const SwapDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string File(const std::string& name) const;

 private:
  // Makes and locks the rank directory; returns who held it last (Note [Stale swap
  // directories]).
  LockHolder Lock(const std::string& job, const std::string& what);
  void CheckSpace(const std::string& nvme_path, const std::string& job, int ranks,
                  int64_t needed_bytes, const std::string& what,
                  const FreeBytesFunction& free_bytes, const LockHolder& previous,
                  int ranks_on_node);
  // Removes what `previous`, a run that did not end cleanly, left in the rank directory;
  // returns the space it took.
  int64_t Reclaim(const std::string& job, const LockHolder& previous);
  // Removes the rank directory's files, then its lock file and the directory (and the job
  // directory when it is empty).
  void Remove() noexcept;

  std::string job_dir_;
  std::string path_;
  std::unique_ptr<DirLock> lock_;
};

}  // namespace ztrain::offload
