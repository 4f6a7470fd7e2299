#include "offload/swap_dir.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "core/logging.h"
#include "core/memory_tracker.h"
#include "offload/io/swap_file.h"
#include "core/dir_lock.h"

namespace ztrain::offload {

namespace fs = std::filesystem;

namespace {

using ::ztrain::detail::StrCat;

// The files under a directory, but its lock file: how many and the space they take on disk
// (allocated blocks, which is what removing them frees).
struct Usage {
  int64_t files = 0;
  int64_t bytes = 0;
};

// A rank directory that no live process holds (Note [Stale swap directories]).
struct StaleDir {
  int rank = 0;
  std::string path;
  Usage usage;
};

// The entries of `dir` but its lock file; none when it cannot be read.
std::vector<fs::path> Entries(const fs::path& dir) {
  std::vector<fs::path> entries;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename() != DirLock::kFileName) entries.push_back(it->path());
  }
  return entries;
}

Usage UsageOf(const fs::path& dir) {
  Usage usage;
  std::vector<fs::path> todo = Entries(dir);
  while (!todo.empty()) {
    const fs::path path = todo.back();
    todo.pop_back();
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      for (const fs::path& p : Entries(path)) todo.push_back(p);
    } else {
      usage.files += S_ISREG(st.st_mode) ? 1 : 0;
      usage.bytes += static_cast<int64_t>(st.st_blocks) * 512;
    }
  }
  return usage;
}

// Removes everything in `dir` but its lock file.
void RemoveEntries(const fs::path& dir, std::error_code& ec) {
  for (const fs::path& entry : Entries(dir)) {
    fs::remove_all(entry, ec);
    if (ec) return;
  }
}

// `s` quoted for a POSIX shell.
std::string ShellQuote(const std::string& s) {
  std::string quoted = "'";
  for (const char c : s) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string Plural(int64_t n, const std::string& one, const std::string& many) {
  return StrCat(n, " ", n == 1 ? one : many);
}

// rank<R> -> R; -1 for any other name.
int RankOf(const std::string& name) {
  const std::string digits = name.substr(std::min<size_t>(4, name.size()));
  const bool ok = name.rfind("rank", 0) == 0 && !digits.empty() && digits.size() < 9 &&
                  std::all_of(digits.begin(), digits.end(),
                              [](unsigned char c) { return std::isdigit(c) != 0; });
  return ok ? std::stoi(digits) : -1;
}

// Rank directories of the job from `ranks` up that hold something and no live process holds.
std::vector<StaleDir> StaleDirsOfOtherRuns(const std::string& job_dir, int ranks) {
  std::vector<StaleDir> stale;
  std::error_code ec;
  for (fs::directory_iterator it(job_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int rank = RankOf(it->path().filename().string());
    if (rank < ranks || !it->is_directory(ec)) continue;
    const std::string path = it->path().string();
    // Empty: being made or removed right now, and nothing to gain.
    if (Entries(path).empty() && !fs::exists(path + "/" + DirLock::kFileName)) continue;
    try {
      if (DirLock::IsHeld(path)) continue;
    } catch (const IoError&) {
      continue;  // cannot tell (e.g. another user's directory): not ours to name
    }
    stale.push_back({rank, path, UsageOf(path)});
  }
  std::sort(stale.begin(), stale.end(),
            [](const StaleDir& a, const StaleDir& b) { return a.rank < b.rank; });
  return stale;
}

// Bytes in the rank directories of this run (below `ranks`) that a live process holds, but
// `own`: what the node's other ranks have already put on this disk.
int64_t BytesOfLiveRanks(const std::string& job_dir, int ranks, const std::string& own) {
  int64_t bytes = 0;
  std::error_code ec;
  for (fs::directory_iterator it(job_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int rank = RankOf(it->path().filename().string());
    if (rank < 0 || rank >= ranks || it->path() == fs::path(own) || !it->is_directory(ec)) {
      continue;
    }
    try {
      if (!DirLock::IsHeld(it->path().string())) continue;
    } catch (const IoError&) {
      continue;
    }
    bytes += UsageOf(it->path()).bytes;
  }
  return bytes;
}

int64_t BytesOf(const std::vector<StaleDir>& dirs) {
  int64_t bytes = 0;
  for (const StaleDir& d : dirs) bytes += d.usage.bytes;
  return bytes;
}

// "2 swap directories of job J ... holds: A (1.00 MiB), B (2.00 MiB); remove them with:
// rm -rf 'A' 'B'".
std::string Describe(const std::vector<StaleDir>& dirs, const std::string& job) {
  std::string list, command = "rm -rf";
  for (const StaleDir& d : dirs) {
    list += StrCat(list.empty() ? "" : ", ", d.path, " (", FormatBytes(d.usage.bytes), ")");
    command += StrCat(" ", ShellQuote(d.path));
  }
  return StrCat(Plural(static_cast<int64_t>(dirs.size()), "swap directory", "swap directories"),
                " of job ", job,
                " left by an earlier run with more ranks, that no running process holds: ", list,
                "; remove them with: ", command);
}

}  // namespace

SwapDir::SwapDir(const std::string& nvme_path, const std::string& job, int rank, int ranks,
                 int64_t needed_bytes, const std::string& what, FreeBytesFunction free_bytes,
                 int ranks_on_node) {
  ZTRAIN_ASSERT(rank >= 0 && rank < ranks, "rank ", rank, " of ", ranks);
  std::error_code ec;
  ZTRAIN_CHECK_T(IoError, fs::is_directory(nvme_path, ec), what, ".nvme_path '", nvme_path,
                 "' is not a directory; create it or point nvme_path at a local NVMe mount");
  job_dir_ = (fs::path(nvme_path) / ("ztrain-" + job)).string();
  path_ = (fs::path(job_dir_) / ("rank" + std::to_string(rank))).string();
  const LockHolder previous = Lock(job, what);
  try {
    CheckSpace(nvme_path, job, ranks, needed_bytes, what,
               free_bytes ? free_bytes : FreeBytesFunction(FreeBytes), previous,
               std::max(1, ranks_on_node));
  } catch (...) {
    Remove();
    throw;
  }
}

SwapDir::~SwapDir() { Remove(); }

std::string SwapDir::File(const std::string& name) const {
  return (fs::path(path_) / name).string();
}

LockHolder SwapDir::Lock(const std::string& job, const std::string& what) {
  // Another rank of the job may remove the (then empty) job directory between our making it
  // and making rank<R> below it, when its previous engine goes: try again.
  std::error_code ec;
  for (int attempt = 0; attempt < 100; ++attempt) {
    ec.clear();
    if (fs::create_directories(path_, ec) || fs::is_directory(path_)) break;
  }
  ZTRAIN_CHECK_T(IoError, fs::is_directory(path_), "cannot create the swap directory ", path_, ": ",
                 ec.message());
  LockHolder holder;
  lock_ = DirLock::TryLock(path_, job, &holder);
  ZTRAIN_CHECK_T(
      IoError, lock_ != nullptr, what, ": swap directory ", path_, " is in use by a running job: ",
      holder.IsThisProcess() ? "this process (" + holder.Describe() + ")" : holder.Describe(),
      "; give this run another training.job_name or nvme_path");
  return holder;
}

void SwapDir::CheckSpace(const std::string& nvme_path, const std::string& job, int ranks,
                         int64_t needed_bytes, const std::string& what,
                         const FreeBytesFunction& free_bytes, const LockHolder& previous,
                         int ranks_on_node) {
  // Read before the stale files go, which they count towards.
  const int64_t free = free_bytes(nvme_path);
  const int64_t reclaimed = Reclaim(job, previous);
  const std::vector<StaleDir> others = StaleDirsOfOtherRuns(job_dir_, ranks);
  if (ranks_on_node > 1) {  // Note [Swap space per node]
    const int64_t taken = BytesOfLiveRanks(job_dir_, ranks, path_);
    const int64_t node_needed = needed_bytes * ranks_on_node;
    ZTRAIN_CHECK_T(
        IoError, free + reclaimed + taken >= node_needed, what, " needs ",
        FormatBytes(node_needed), " (", node_needed, " bytes) of swap space on this node under ",
        nvme_path, ": its ", ranks_on_node, " ranks share that disk and each needs ",
        FormatBytes(needed_bytes), ", but only ", FormatBytes(free + reclaimed + taken),
        " are free or theirs already",
        taken == 0 ? "" : StrCat(" (", FormatBytes(taken), " in use by this node's other ranks)"),
        "; free space, point nvme_path at a larger disk, run fewer ranks per node, or offload "
        "less (offload_param.max_in_cpu, or device \"cpu\")");
  }
  ZTRAIN_CHECK_T(
      IoError, free + reclaimed >= needed_bytes, what, " needs ", FormatBytes(needed_bytes), " (",
      needed_bytes, " bytes) of swap space on this rank under ", nvme_path, " but only ",
      FormatBytes(free + reclaimed), " are free",
      reclaimed == 0
          ? ""
          : StrCat(" (", FormatBytes(free), " free on its file system and ", FormatBytes(reclaimed),
                   " of stale swap files removed from ", path_, ")"),
      others.empty() ? ""
                     : StrCat("; another ", FormatBytes(BytesOf(others)), " is held by ",
                              Describe(others, job)),
      "; free space, point nvme_path at a larger disk, or offload less (offload_param.max_in_cpu, "
      "or device \"cpu\")");
  if (!others.empty()) Log().warn("found {}", Describe(others, job));
}

int64_t SwapDir::Reclaim(const std::string& job, const LockHolder& previous) {
  const Usage stale = UsageOf(path_);
  if (Entries(path_).empty()) return 0;
  std::error_code ec;
  RemoveEntries(path_, ec);
  ZTRAIN_CHECK_T(IoError, !ec, "cannot remove the swap files that an earlier run left in ", path_,
                 ": ", ec.message(), "; remove them: rm -rf ", ShellQuote(path_));
  Log().warn("removed {} ({}) left in {} by an earlier run of job {} that did not end cleanly{}",
             Plural(stale.files, "swap file", "swap files"), FormatBytes(stale.bytes), path_, job,
             previous.known() ? " (" + previous.Describe() + ")" : "");
  return stale.bytes;
}

void SwapDir::Remove() noexcept {
  std::error_code ec;
  RemoveEntries(path_, ec);
  if (ec) Log().warn("could not remove the swap files in {}: {}", path_, ec.message());
  // The lock file goes while still locked (see DirLock::RemoveFile), then the directory
  // and, with its last rank directory, the job directory (other ranks may still use it).
  if (lock_) lock_->RemoveFile();
  lock_.reset();
  fs::remove(path_, ec);
  fs::remove(job_dir_, ec);
}

}  // namespace ztrain::offload
