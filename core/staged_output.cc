#include "core/staged_output.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/logging.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using ::ztrain::detail::StrCat;

constexpr const char* kStagingTag = ".ztrain-staging.";

std::string HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "localhost";
  return host;
}

// `out` without a trailing separator, made absolute.
fs::path Normalized(const std::string& out) {
  fs::path p = fs::absolute(fs::path(out)).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

std::string StagingPrefix(const fs::path& out) {
  return StrCat(".", out.filename().string(), kStagingTag);
}

bool ProcessAlive(long pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

// What an existing output holds, for the refusal: its first few entries.
std::string Contents(const fs::path& out) {
  std::error_code ec;
  if (!fs::is_directory(out, ec)) return "a file";
  std::string list;
  int shown = 0, total = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(out, ec)) {
    if (++total <= 4) list += (shown++ ? ", " : "") + e.path().filename().string();
  }
  if (total > 4) list += StrCat(" and ", total - 4, " more");
  return list;
}

bool NonEmpty(const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(out, ec))) return false;
  if (!fs::is_directory(out, ec)) return true;
  return fs::directory_iterator(out, ec) != fs::directory_iterator();
}

void SyncDirectory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // durability only: the rename itself has happened
  ::fsync(fd);
  ::close(fd);
}

// Swaps the names `a` and `b` (both exist) in one step where the file system can; else moves
// b aside, a into place, and reports where b's content went in `*aside`.
void Exchange(const fs::path& a, const fs::path& b, std::string* aside) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) {
    *aside = a.string();
    return;
  }
  ZTRAIN_CHECK_T(IoError, errno == EINVAL || errno == ENOSYS || errno == ENOTSUP, "cannot put '",
                 a.string(), "' in place of '", b.string(), "': ", std::strerror(errno));
  const std::string old = a.string() + ".old";
  ZTRAIN_CHECK_T(IoError, std::rename(b.c_str(), old.c_str()) == 0, "cannot move '", b.string(),
                 "' aside to '", old, "': ", std::strerror(errno));
  if (std::rename(a.c_str(), b.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    std::rename(old.c_str(), b.c_str());  // the previous output back in place
    throw IoError(StrCat("cannot rename '", a.string(), "' to '", b.string(), "': ", err));
  }
  *aside = old;
}

// The staging names beside `out` (of any run: Note [Staged outputs]).
std::vector<fs::path> StagingNames(const fs::path& out) {
  const std::string prefix = StagingPrefix(out);
  std::vector<fs::path> found;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(out.parent_path(), ec)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) found.push_back(e.path());
  }
  return found;
}

// Removes the staging names of `out` whose process is gone on this host; names the others.
void CleanLeftovers(const fs::path& out) {
  const std::string prefix = StagingPrefix(out), host = HostName();
  for (const fs::path& path : StagingNames(out)) {
    const std::string rest = path.filename().string().substr(prefix.size());  // <pid>@<host>...
    const size_t at = rest.find('@');
    const long pid = at == std::string::npos ? 0 : std::atol(rest.substr(0, at).c_str());
    const bool ours = at != std::string::npos && rest.compare(at + 1, host.size(), host) == 0;
    if (ours && !ProcessAlive(pid)) {
      std::error_code rm;
      fs::remove_all(path, rm);
      Log().info("removed {}, left by a run that was killed before it finished (pid {})",
                 path.string(), pid);
    } else if (!ours || pid != ::getpid()) {
      Log().warn("{} is the unfinished output of another run (pid {}{}); left as it is",
                 path.string(), pid, ours ? ", still running" : " on another host");
    }
  }
}

struct FileId {
  dev_t dev;
  ino_t ino;
  bool operator==(const FileId& o) const { return dev == o.dev && ino == o.ino; }
};

std::optional<FileId> IdOf(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

// The identities of `p` (links resolved) and of every directory above it that exists.
std::vector<FileId> Chain(const std::string& p) {
  std::error_code ec;
  fs::path at = fs::weakly_canonical(fs::absolute(p), ec);
  if (ec) at = Normalized(p);
  std::vector<FileId> ids;
  while (true) {
    if (auto id = IdOf(at)) ids.push_back(*id);
    if (at == at.parent_path() || at.empty()) break;
    at = at.parent_path();
  }
  return ids;
}

bool Contains(const std::vector<FileId>& ids, const FileId& id) {
  for (const FileId& i : ids) {
    if (i == id) return true;
  }
  return false;
}

}  // namespace

StagedOutput::StagedOutput(std::string out, Kind kind, bool overwrite, std::string what)
    : out_(std::move(out)), final_(Normalized(out_).string()), what_(std::move(what)), kind_(kind) {
  const fs::path final_path(final_);
  const std::string name = final_path.filename().string();
  ZTRAIN_CHECK_T(ConfigError, !name.empty() && name != "." && name != "..", what_, " '", out_,
                 "' names no file or directory");
  std::error_code ec;
  const bool is_dir = fs::is_directory(final_path, ec);
  ZTRAIN_CHECK_T(ConfigError, kind_ == Kind::kDirectory || !is_dir, what_, " '", out_,
                 "' is a directory; this writes one file: name the file");
  ZTRAIN_CHECK_T(ConfigError, overwrite || !NonEmpty(final_path), what_, " '", out_,
                 "' already holds ", Contents(final_path),
                 ": nothing is overwritten unless asked; give --overwrite to replace it (the "
                 "new output takes its place only once it is whole), or choose another ",
                 what_);
  fs::create_directories(final_path.parent_path(), ec);
  ZTRAIN_CHECK_T(IoError, fs::is_directory(final_path.parent_path()), "cannot create '",
                 final_path.parent_path().string(), "' for ", what_, ": ", ec.message());
  CleanLeftovers(final_path);
  staging_ =
      (final_path.parent_path() / StrCat(StagingPrefix(final_path), ::getpid(), "@", HostName()))
          .string();
  fs::remove_all(staging_, ec);
  if (kind_ == Kind::kDirectory) {
    ZTRAIN_CHECK_T(IoError, fs::create_directory(staging_, ec), "cannot create '", staging_,
                   "' to stage ", what_, " '", out_, "': ", ec.message());
  }
}

StagedOutput::~StagedOutput() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

void StagedOutput::Commit() {
  const fs::path final_path(final_), staged(staging_);
  std::error_code ec;
  ZTRAIN_CHECK_T(IoError, fs::exists(fs::symlink_status(staged, ec)), "nothing was written to '",
                 staging_, "' for ", what_, " '", out_, "'");
  const bool replace = fs::exists(fs::symlink_status(final_path, ec));
  if (!replace || kind_ == Kind::kFile) {  // rename(2) replaces a file atomically
    ZTRAIN_CHECK_T(IoError, std::rename(staged.c_str(), final_path.c_str()) == 0, "cannot rename '",
                   staging_, "' to '", out_, "': ", std::strerror(errno));
  } else {
    std::string old;
    Exchange(staged, final_path, &old);
    fs::remove_all(old, ec);
    if (ec) Log().warn("cannot remove the replaced {} at {}: {}", what_, old, ec.message());
  }
  committed_ = true;
  SyncDirectory(final_path.parent_path());
}

std::vector<std::string> StagedOutput::Leftovers(const std::string& out) {
  std::vector<std::string> found;
  for (const fs::path& p : StagingNames(Normalized(out))) found.push_back(p.string());
  return found;
}

void CheckOutputIsNoInput(const std::string& out, const std::string& what,
                          const std::vector<NamedInput>& inputs) {
  const std::vector<FileId> out_chain = Chain(out);
  const std::optional<FileId> out_id = IdOf(Normalized(out));
  for (const NamedInput& in : inputs) {
    if (in.path.empty()) continue;
    const std::optional<FileId> in_id = IdOf(fs::path(in.path));
    if (!in_id) continue;
    const std::string named = StrCat(in.what, " '", in.path, "'");
    ZTRAIN_CHECK_T(ConfigError, !(out_id && *out_id == *in_id), what, " '", out, "' is ", named,
                   ", which this command reads: writing there would replace it; choose another ",
                   what);
    ZTRAIN_CHECK_T(ConfigError, !Contains(out_chain, *in_id), what, " '", out, "' lies inside ",
                   named,
                   ", which this command reads: writing there could replace its files; "
                   "choose another ",
                   what, " outside it");
    ZTRAIN_CHECK_T(
        ConfigError, !(out_id && Contains(Chain(in.path), *out_id)), what, " '", out, "' contains ",
        named, ", which this command reads: replacing it would delete that; choose another ", what);
  }
}

}  // namespace ztrain
