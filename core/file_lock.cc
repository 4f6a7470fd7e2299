#include "core/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "core/error.h"

namespace ztrain {

std::optional<FileLock> FileLock::TryLock(const std::string& path, const std::string& holder,
                                          std::string* current_holder) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ZTRAIN_CHECK_T(IoError, fd >= 0, "cannot open the lock file ", path, ": ", std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (current_holder) {
      char text[512] = {};
      const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
      std::string line(text, n > 0 ? static_cast<size_t>(n) : 0);
      while (!line.empty() && (line.back() == '\n' || line.back() == '\0')) line.pop_back();
      *current_holder = line.empty() ? "a process that has not written its name yet" : line;
    }
    ::close(fd);
    ZTRAIN_CHECK_T(IoError, err == EWOULDBLOCK, "cannot lock ", path, ": ", std::strerror(err));
    return std::nullopt;
  }
  const std::string line = holder + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, line.data(), line.size(), 0) < 0) {
    // The lock holds without its holder's name; a refusal then says so.
  }
  return FileLock(fd, path);
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the lock; the file stays for the next holder
}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

std::string DescribeThisProcess(const std::string& job) {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[32] = "";
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  return detail::StrCat("pid ", ::getpid(), " on host ", host, ", job ", job, ", since ", when);
}

}  // namespace ztrain
