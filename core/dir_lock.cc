#include "core/dir_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sstream>
#include <string>
#include <utility>

#include "core/error.h"

namespace ztrain {
namespace {

using ::ztrain::detail::StrCat;

std::string ErrnoText(int err) { return std::strerror(err); }

// A descriptor closed on every way out of a function that may throw.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

std::string LockPath(const std::string& dir) { return dir + "/" + DirLock::kFileName; }

struct flock WholeFile(short type) {
  struct flock fl = {};  // l_pid must be 0 for OFD locks
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  return fl;
}

std::string HostName() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

std::string Now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm = {};
  localtime_r(&now, &tm);
  char text[64] = {};
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S %Z", &tm);
  return text;
}

// The lock file's text: one key=value a line.
std::string Format(const LockHolder& h) {
  return StrCat("job=", h.job, "\nhost=", h.host, "\npid=", h.pid, "\nsince=", h.since, "\n");
}

LockHolder Parse(const std::string& text) {
  LockHolder h;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "job") h.job = value;
    if (key == "host") h.host = value;
    if (key == "since") h.since = value;
    if (key == "pid") h.pid = std::atoll(value.c_str());
  }
  return h;
}

std::string ReadAll(int fd) {
  std::string text(4096, '\0');
  const ssize_t n = pread(fd, text.data(), text.size(), 0);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return text;
}

void Write(int fd, const std::string& path, const std::string& text) {
  const bool ok = ftruncate(fd, 0) == 0 &&
                  pwrite(fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size());
  ZTRAIN_CHECK_T(IoError, ok, "cannot write the directory lock ", path, ": ", ErrnoText(errno));
}

// Whether `fd` is still the file at `path`: a holder removes its lock file before it lets go.
bool StillAtPath(int fd, const std::string& path) {
  struct stat opened, named;
  if (fstat(fd, &opened) != 0 || stat(path.c_str(), &named) != 0) return false;
  return opened.st_dev == named.st_dev && opened.st_ino == named.st_ino;
}

}  // namespace

bool LockHolder::IsThisProcess() const { return pid == getpid() && host == HostName(); }

std::string LockHolder::Describe() const {
  if (!known()) return "a process that its lock file does not name";
  return StrCat("pid ", pid, " on host ", host, " since ", since);
}

std::unique_ptr<DirLock> DirLock::TryLock(const std::string& dir, const std::string& job,
                                          LockHolder* holder) {
  const std::string path = LockPath(dir);
  for (int attempt = 0; attempt < 100; ++attempt) {
    Fd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    ZTRAIN_CHECK_T(IoError, fd.get() >= 0, "cannot open the directory lock ", path, ": ",
                   ErrnoText(errno));
    struct flock fl = WholeFile(F_WRLCK);
    if (fcntl(fd.get(), F_OFD_SETLK, &fl) != 0) {
      const int err = errno;
      ZTRAIN_CHECK_T(IoError, err == EAGAIN || err == EACCES, "cannot lock ", path, ": ",
                     ErrnoText(err),
                     "; the file system must support fcntl locks: use a "
                     "local file system, or NFS with locking");
      *holder = Parse(ReadAll(fd.get()));
      return nullptr;
    }
    if (!StillAtPath(fd.get(), path)) continue;  // its holder removed it as we opened it
    *holder = Parse(ReadAll(fd.get()));
    Write(fd.get(), path, Format({job, HostName(), Now(), getpid()}));
    return std::unique_ptr<DirLock>(new DirLock(fd.release(), path));
  }
  throw IoError(StrCat("cannot lock ", path, ": it was removed and made again 100 times"));
}

bool DirLock::IsHeld(const std::string& dir) {
  const std::string path = LockPath(dir);
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0 && errno == ENOENT) return false;
  ZTRAIN_CHECK_T(IoError, fd.get() >= 0, "cannot open the directory lock ", path, ": ",
                 ErrnoText(errno));
  struct flock fl = WholeFile(F_WRLCK);
  ZTRAIN_CHECK_T(IoError, fcntl(fd.get(), F_OFD_GETLK, &fl) == 0, "cannot query the lock ", path,
                 ": ", ErrnoText(errno));
  return fl.l_type != F_UNLCK;
}

std::optional<LockHolder> DirLock::Holder(const std::string& dir) {
  if (!IsHeld(dir)) return std::nullopt;
  Fd fd(open(LockPath(dir).c_str(), O_RDONLY | O_CLOEXEC));
  return fd.get() >= 0 ? Parse(ReadAll(fd.get())) : LockHolder{};
}

DirLock::~DirLock() { close(fd_); }

void DirLock::RemoveFile() noexcept { unlink(path_.c_str()); }

}  // namespace ztrain
