#pragma once
// FileLock: an exclusive advisory lock (flock(2)) on a file, held for the object's lifetime,
// so that two live runs never use the same directory while a run that was killed cannot leave
// it locked: the kernel drops the lock when the holding process ends, however it ends (on NFS,
// Linux maps flock to POSIX byte-range locks, which the server also drops when the client
// process goes).
//
// The lock file holds a line naming its holder ("pid 4242 on host node07, job gpt2-zero3,
// since 2026-12-01 21:30:05"), written when the lock is taken, so that a refusal can say who
// holds it. Move-only; not thread safe. TryLock fails only by returning empty; errors opening
// the file are IoError naming it.
#include <optional>
#include <string>

namespace ztrain {

class FileLock {
 public:
  // Takes the lock on `path` (created when missing) without waiting and writes `holder` into
  // it; nullopt when another open file holds it, with that holder's line in *current_holder.
  static std::optional<FileLock> TryLock(const std::string& path, const std::string& holder,
                                         std::string* current_holder);
  ~FileLock();
  FileLock(FileLock&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
    other.fd_ = -1;
  }
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  FileLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// "pid 4242 on host node07, job <job>, since 2026-12-01 21:30:05": this process, for a lock's
// holder line.
std::string DescribeThisProcess(const std::string& job);

}  // namespace ztrain
