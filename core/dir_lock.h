#pragma once
// DirLock: the lock that marks a directory as in use by a live process, so that two live runs
// never share a swap directory (Note [Stale swap directories], offload/swap_dir.h) or a
// checkpoint.dir (checkpoint/checkpoint.h), while a run that was killed leaves nothing stuck.
//
// The lock is an open-file-description lock (fcntl F_OFD_SETLK) on <dir>/ztrain.lock, a file
// that also names the holder. It is not flock(2), because whether an OFD lock is held can be
// asked without taking it (F_OFD_GETLK), and not a classic POSIX record lock, which any
// close() of the file anywhere in the process would drop. The kernel releases it when the
// holder's process ends in any way, SIGKILL included; the file stays and names who held it
// last. A lock file is only removed while held (RemoveFile), and TryLock checks that the
// file it locked is still the one at the path, so two processes never both believe they
// hold a directory.
// Thread safety: none needed (one owner). Failures of the system calls throw IoError naming
// the lock file.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace ztrain {

// What a lock file says of the process that holds (or last held) it.
struct LockHolder {
  std::string job;
  std::string host;
  std::string since;  // when it took the lock, local time
  int64_t pid = 0;    // 0: the file names nobody (new, empty or unreadable)

  bool known() const { return pid > 0; }
  // Whether it is this very process.
  bool IsThisProcess() const;
  // "pid 123 on host node7 since 2025-01-31 10:00:00 CET".
  std::string Describe() const;
};

class DirLock {
 public:
  static constexpr const char* kFileName = "ztrain.lock";

  // Takes the lock of `dir` (an existing directory), creating its lock file, and writes this
  // process and `job` into it. Returns null when a live process holds it; `*holder` is then
  // that process, and otherwise the one that held it last (unknown when none did).
  static std::unique_ptr<DirLock> TryLock(const std::string& dir, const std::string& job,
                                          LockHolder* holder);
  // Whether a live process holds `dir`'s lock, asked without taking it; false when `dir` has
  // no lock file.
  static bool IsHeld(const std::string& dir);
  // The live process holding `dir`'s lock, asked without taking it; nullopt when none does.
  static std::optional<LockHolder> Holder(const std::string& dir);

  ~DirLock();  // releases the lock
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  // Removes the lock file while still holding the lock: a process that opened it before
  // finds, once it gets the lock, that the file is gone and starts again.
  void RemoveFile() noexcept;

 private:
  DirLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  int fd_;
  std::string path_;
};

}  // namespace ztrain
