#include "core/staged_output.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/logging.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using ::ztrain::detail::StrCat;

constexpr const char* kStagingTag = ".ztrain-staging.";
constexpr const char* kJournal = ".ztrain-commit";  // Note [Staged file sets]

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

// A commit's journal (Note [Staged file sets]): the files to put in place, in order, and the
// earlier set's files to remove.
struct Journal {
  std::vector<std::string> put, remove;
};

std::optional<Journal> ReadJournal(const fs::path& staging) {
  std::ifstream in(staging / kJournal);
  if (!in) return std::nullopt;
  Journal j;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("put ", 0) == 0) j.put.push_back(line.substr(4));
    if (line.rfind("remove ", 0) == 0) j.remove.push_back(line.substr(7));
  }
  return j;
}

// Writes the journal whole (a temporary file, synced, renamed): its existence decides the commit.
void WriteJournal(const fs::path& staging, const Journal& j) {
  std::string text;
  for (const std::string& n : j.put) text += StrCat("put ", n, "\n");
  for (const std::string& n : j.remove) text += StrCat("remove ", n, "\n");
  const fs::path tmp = staging / StrCat(kJournal, ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZTRAIN_CHECK_T(IoError, fd >= 0, "cannot create '", tmp.string(), "': ", std::strerror(errno));
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                       ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  ZTRAIN_CHECK_T(IoError, written, "cannot write '", tmp.string(), "': ", std::strerror(err));
  ZTRAIN_CHECK_T(IoError, std::rename(tmp.c_str(), (staging / kJournal).c_str()) == 0,
                 "cannot rename '", tmp.string(), "': ", std::strerror(errno));
  SyncDirectory(staging);
}

// Carries out a decided commit; any step may have been done already by a run killed in the
// middle of it. Returns the paths of the earlier set it removed.
std::vector<std::string> ApplyJournal(const fs::path& staging, const Journal& j) {
  const fs::path dir = staging.parent_path();
  for (const std::string& name : j.put) {
    const fs::path from = staging / name, to = dir / name;
    if (std::rename(from.c_str(), to.c_str()) == 0) continue;
    const int err = errno;  // ENOENT: a killed run put this one in place already
    std::error_code ec;
    ZTRAIN_CHECK_T(IoError, err == ENOENT && fs::exists(to, ec), "cannot put '", from.string(),
                   "' in place as '", to.string(), "': ", std::strerror(err));
  }
  std::vector<std::string> removed;
  for (const std::string& name : j.remove) {
    const fs::path old = dir / name;
    if (::unlink(old.c_str()) == 0) {
      removed.push_back(old.string());
      continue;
    }
    const int err = errno;
    ZTRAIN_CHECK_T(IoError, err == ENOENT, "cannot remove '", old.string(),
                   "' of the earlier output: ", std::strerror(err));
  }
  SyncDirectory(dir);
  std::error_code ec;
  fs::remove_all(staging, ec);
  return removed;
}

// The pid and host a staging name carries (`<prefix><pid>@<host>`); pid 0 when it has none.
std::pair<long, std::string> Owner(const fs::path& staging, const std::string& prefix) {
  const std::string rest = staging.filename().string().substr(prefix.size());
  const size_t at = rest.find('@');
  if (at == std::string::npos) return {0, ""};
  return {std::atol(rest.substr(0, at).c_str()), rest.substr(at + 1)};
}

// Finishes the commits of `out` that runs on this host decided but did not finish (their
// process is gone, or it is this one), removes their other staging names, and names those of
// running processes and other hosts.
void CleanLeftovers(const fs::path& out) {
  const std::string prefix = StagingPrefix(out), host = HostName();
  for (const fs::path& path : StagingNames(out)) {
    const auto [pid, owner_host] = Owner(path, prefix);
    // A writer's own temporary beside the staging name (`<staging>.tmp`) is ours too.
    const bool ours =
        pid > 0 && (owner_host == host || owner_host.rfind(host + ".", 0) == 0);
    if (!ours || (pid != ::getpid() && ProcessAlive(pid))) {
      Log().warn("{} is the unfinished output of another run (pid {}{}); left as it is",
                 path.string(), pid, ours ? ", still running" : " on another host");
      continue;
    }
    if (const std::optional<Journal> journal = ReadJournal(path)) {
      ApplyJournal(path, *journal);
      Log().info("finished putting {} in place: the run that wrote it (pid {}) was killed while "
                 "it did so",
                 out.string(), pid);
      continue;
    }
    std::error_code rm;
    fs::remove_all(path, rm);
    if (pid != ::getpid()) {
      Log().info("removed {}, left by a run that was killed before it finished (pid {})",
                 path.string(), pid);
    }
  }
}

// Creates nothing: the name under which this process stages `out`.
fs::path OwnStagingPath(const fs::path& out) {
  return out.parent_path() / StrCat(StagingPrefix(out), ::getpid(), "@", HostName());
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
  staging_ = OwnStagingPath(final_path).string();
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

StagedFileSet::StagedFileSet(std::string out, std::function<bool(const std::string&)> earlier,
                             std::string what)
    : out_(std::move(out)), what_(std::move(what)), earlier_(std::move(earlier)) {
  const fs::path final_path = Normalized(out_);
  dir_ = final_path.parent_path().string();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  ZTRAIN_CHECK_T(IoError, fs::is_directory(dir_), "cannot create '", dir_, "' for ", what_, ": ",
                 ec.message());
  CleanLeftovers(final_path);
  staging_ = OwnStagingPath(final_path).string();
  fs::remove_all(staging_, ec);
  ZTRAIN_CHECK_T(IoError, fs::create_directory(staging_, ec), "cannot create '", staging_,
                 "' to stage ", what_, " '", out_, "': ", ec.message());
}

StagedFileSet::~StagedFileSet() {
  if (committed_) return;  // a decided commit is finished by the next run, never undone
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

std::string StagedFileSet::PathOf(const std::string& name) const {
  ZTRAIN_ASSERT(!name.empty() && name.find_first_of("/\n") == std::string::npos,
                "a staged file is named by a plain file name");
  return (fs::path(staging_) / name).string();
}

std::vector<std::string> StagedFileSet::Commit(const std::vector<std::string>& names) {
  Journal journal;
  for (const std::string& name : names) {
    std::error_code ec;
    ZTRAIN_CHECK_T(IoError, fs::is_regular_file(PathOf(name), ec), "nothing was written to '",
                   PathOf(name), "' for ", what_, " '", out_, "'");
    journal.put.push_back(name);
  }
  const std::set<std::string> replaced(names.begin(), names.end());
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && !replaced.contains(name) && earlier_(name)) {
      journal.remove.push_back(name);
    }
  }
  std::sort(journal.remove.begin(), journal.remove.end());
  WriteJournal(staging_, journal);
  committed_ = true;
  return ApplyJournal(staging_, journal);
}

void StagedFileSet::FinishInterrupted(const std::string& out) { CleanLeftovers(Normalized(out)); }

void CheckNoUnfinishedCommit(const std::vector<std::string>& files, const std::string& what) {
  std::map<fs::path, std::vector<fs::path>> by_dir;
  for (const std::string& f : files) {
    const fs::path p = fs::absolute(f).lexically_normal();
    by_dir[p.parent_path()].push_back(p);
  }
  for (const auto& [dir, in_dir] : by_dir) {
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      const size_t tag = name.find(kStagingTag);
      if (name.empty() || name[0] != '.' || tag == std::string::npos) continue;
      const std::optional<Journal> journal = ReadJournal(e.path());
      if (!journal) continue;
      std::set<std::string> names(journal->put.begin(), journal->put.end());
      names.insert(journal->remove.begin(), journal->remove.end());
      const fs::path out = dir / name.substr(1, tag - 1);
      const auto [pid, host] = Owner(e.path(), StagingPrefix(out));
      for (const fs::path& f : in_dir) {
        ZTRAIN_CHECK_T(
            ConfigError, !names.contains(f.filename().string()), what, " file '", f.string(),
            "' belongs to '", out.string(), "', which a run (pid ", pid, " on ", host,
            ") was putting in place when it stopped or is still putting in place: those files "
            "mix two versions (the rest are in '", e.path().string(), "'). Run the command that "
            "wrote '", out.string(), "' again (ztrain data with the same --out): it finishes "
            "putting it in place before anything else");
      }
    }
  }
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
