#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/logging.h"

namespace ztrain::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::ztrain::detail::StrCat;

constexpr char kMagic[8] = {'Z', 'T', 'C', 'K', 'P', 'T', '0', '1'};
constexpr size_t kTrailer = 16;  // index bytes (u64) + magic

std::string Errno() { return std::strerror(errno); }

void WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    ZTRAIN_CHECK_T(IoError, n > 0, "cannot write checkpoint file ", path, ": ", Errno(),
                   errno == ENOSPC ? " (the disk is full: free space or set checkpoint.dir "
                                     "elsewhere)"
                                   : "");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void ReadAt(int fd, void* out, size_t bytes, int64_t offset, const std::string& path) {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    ZTRAIN_CHECK_T(IoError, n > 0, "cannot read checkpoint file ", path, " at offset ", offset,
                   ": ", n == 0 ? "the file ends early (it is truncated)" : Errno());
    p += n;
    offset += n;
    bytes -= static_cast<size_t>(n);
  }
}

// Writes `text` to dir/name through a temporary file, fsync and rename.
void WriteFileAtomically(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name, tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZTRAIN_CHECK_T(IoError, fd >= 0, "cannot create ", tmp, ": ", Errno());
  try {
    WriteAll(fd, text.data(), text.size(), tmp);
    ZTRAIN_CHECK_T(IoError, ::fsync(fd) == 0, "cannot fsync ", tmp, ": ", Errno());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  ZTRAIN_CHECK_T(IoError, ::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ",
                 path, ": ", Errno());
  SyncDirectory(dir);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  ZTRAIN_CHECK_T(IoError, in.good(), "cannot read ", path, ": ", Errno());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// "step<N>" -> N, or -1.
int64_t StepOf(const std::string& name) {
  if (name.rfind("step", 0) != 0 || name.size() == 4 || name.size() > 4 + 18) return -1;
  for (size_t i = 4; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
  }
  return std::stoll(name.substr(4));
}

Kind KindFrom(const std::string& s, const std::string& path) {
  for (Kind k : {Kind::kParam, Kind::kExpAvg, Kind::kExpAvgSq}) {
    if (s == KindName(k)) return k;
  }
  throw IoError(StrCat("checkpoint file ", path, " has an entry of unknown kind '", s, "'"));
}

}  // namespace

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kParam:
      return "param";
    case Kind::kExpAvg:
      return "exp_avg";
    case Kind::kExpAvgSq:
      return "exp_avg_sq";
  }
  return "?";
}

std::string StepName(int64_t step) { return "step" + std::to_string(step); }
std::string RankFileName(int rank) { return "rank" + std::to_string(rank) + ".bin"; }

std::unique_ptr<DirLock> LockDirectory(const std::string& root, const std::string& job) {
  std::error_code ec;
  fs::create_directories(root, ec);
  ZTRAIN_CHECK_T(IoError, fs::is_directory(root), "cannot create checkpoint.dir ", root, ": ",
                 ec.message());
  LockHolder holder;
  std::unique_ptr<DirLock> lock = DirLock::TryLock(root, job, &holder);
  ZTRAIN_CHECK_T(ConfigError, lock != nullptr, "checkpoint.dir ", root,
                 " is in use by a running job (",
                 holder.job.empty() ? "" : "job " + holder.job + ", ", holder.Describe(),
                 "); wait for it to end, or give this run another "
                 "checkpoint.dir");
  return lock;
}

std::string DirectoryHolder(const std::string& root) {
  if (!fs::is_directory(root)) return "";
  const std::optional<LockHolder> holder = DirLock::Holder(root);
  if (!holder) return "";
  return (holder->job.empty() ? "" : "job " + holder->job + ", ") + holder->Describe();
}

void SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ZTRAIN_CHECK_T(IoError, fd >= 0, "cannot open directory ", dir, ": ", Errno());
  const int ret = ::fsync(fd);
  ::close(fd);
  ZTRAIN_CHECK_T(IoError, ret == 0, "cannot fsync directory ", dir, ": ", Errno());
}

// --- ShardWriter -----------------------------------------------------------------------------

ShardWriter::ShardWriter(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZTRAIN_CHECK_T(IoError, fd_ >= 0, "cannot create checkpoint file ", tmp_, ": ", Errno());
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void ShardWriter::Write(const void* data, size_t bytes) {
  WriteAll(fd_, data, bytes, tmp_);
  crc_ = Crc32c(data, bytes, crc_);
  offset_ += static_cast<int64_t>(bytes);
}

void ShardWriter::Add(const std::string& name, Kind kind, const Shape& full_shape,
                      std::vector<Run> runs, const float* data) {
  int64_t count = 0;
  nlohmann::json jruns = nlohmann::json::array();
  for (const Run& r : runs) {
    count += r.count;
    jruns.push_back({r.begin, r.count});
  }
  if (count == 0) return;
  entries_.push_back({{"name", name},
                      {"kind", KindName(kind)},
                      {"shape", full_shape},
                      {"runs", jruns},
                      {"offset", offset_}});
  Write(data, static_cast<size_t>(count) * sizeof(float));
}

ShardWriter::Result ShardWriter::Finish() {
  const std::string index = nlohmann::json{{"entries", entries_}}.dump();
  Write(index.data(), index.size());
  const uint64_t n = index.size();
  Write(&n, sizeof n);
  Write(kMagic, sizeof kMagic);
  ZTRAIN_CHECK_T(IoError, ::fsync(fd_) == 0, "cannot fsync ", tmp_, ": ", Errno());
  ::close(fd_);
  fd_ = -1;
  ZTRAIN_CHECK_T(IoError, ::rename(tmp_.c_str(), path_.c_str()) == 0, "cannot rename ", tmp_, ": ",
                 Errno());
  return {offset_, crc_};
}

// --- ModelIndex ------------------------------------------------------------------------------

ModelIndex::ModelIndex(const std::string& dir, const nlohmann::json& meta) : dir_(dir) {
  const nlohmann::json& files = meta.at("files");
  std::map<std::string, Shape> shapes;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string path = dir + "/" + files[f].at("name").get<std::string>();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ZTRAIN_CHECK_T(IoError, fd >= 0, "checkpoint ", dir, " is missing ", path, " (", Errno(),
                   "); meta.json lists ", files.size(), " rank files");
    fds_.push_back(fd);
    paths_.push_back(path);
    struct stat st {};
    ZTRAIN_CHECK_T(IoError, ::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(kTrailer),
                   "checkpoint file ", path, " is too short to be a rank file (truncated)");
    char trailer[kTrailer];
    ReadAt(fd, trailer, kTrailer, st.st_size - static_cast<off_t>(kTrailer), path);
    ZTRAIN_CHECK_T(IoError, std::memcmp(trailer + 8, kMagic, sizeof kMagic) == 0,
                   "checkpoint file ", path,
                   " does not end with ztrain's trailer (truncated "
                   "or not a rank file)");
    uint64_t n = 0;
    std::memcpy(&n, trailer, sizeof n);
    ZTRAIN_CHECK_T(IoError, n <= static_cast<uint64_t>(st.st_size) - kTrailer, "checkpoint file ",
                   path, " has an index of ", n, " bytes, more than the file holds");
    std::string index(n, '\0');
    const int64_t index_at = st.st_size - static_cast<int64_t>(kTrailer) - static_cast<int64_t>(n);
    ReadAt(fd, index.data(), n, index_at, path);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(index);
    } catch (const std::exception& e) {
      throw IoError(StrCat("checkpoint file ", path, " has a broken index: ", e.what()));
    }
    for (const nlohmann::json& e : j.at("entries")) {
      const std::string name = e.at("name");
      const Kind kind = KindFrom(e.at("kind"), path);
      int64_t offset = e.at("offset");
      std::vector<Segment>& segs = segments_[{name, kind}];
      for (const nlohmann::json& r : e.at("runs")) {
        const int64_t begin = r.at(0), count = r.at(1);
        ZTRAIN_CHECK_T(IoError, offset + count * 4 <= index_at, "checkpoint file ", path,
                       ": entry ", name, " points past its data");
        segs.push_back({begin, count, static_cast<int>(f), offset});
        offset += count * 4;
      }
      if (shapes.emplace(name, e.at("shape").get<Shape>()).second) {
        parameters_.emplace_back(name, e.at("shape").get<Shape>());
      }
    }
  }
  for (auto& [key, segs] : segments_) {
    std::sort(segs.begin(), segs.end(),
              [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
  }
}

ModelIndex::~ModelIndex() {
  for (int fd : fds_) ::close(fd);
}

void ModelIndex::Read(const std::string& name, Kind kind, int64_t begin, int64_t count,
                      float* out) const {
  auto missing = [&](int64_t at) {
    return IoError(StrCat("checkpoint ", dir_, " does not hold elements [", at, ", ", begin + count,
                          ") of ", name, " (", KindName(kind),
                          "): a rank file is missing or the model differs from the checkpoint's"));
  };
  auto it = segments_.find({name, kind});
  if (it == segments_.end()) throw missing(begin);
  const std::vector<Segment>& segs = it->second;
  int64_t at = begin;
  const int64_t end = begin + count;
  // The first segment that ends after `at`.
  auto s = std::upper_bound(segs.begin(), segs.end(), at,
                            [](int64_t x, const Segment& g) { return x < g.begin + g.count; });
  while (at < end) {
    if (s == segs.end() || s->begin > at) throw missing(at);
    const int64_t n = std::min(end, s->begin + s->count) - at;
    ReadAt(fds_[static_cast<size_t>(s->file)], out + (at - begin), static_cast<size_t>(n) * 4,
           s->offset + (at - s->begin) * 4, paths_[static_cast<size_t>(s->file)]);
    at += n;
    ++s;
  }
}

// --- Metadata, verification, the directory ----------------------------------------------------

nlohmann::json ReadMeta(const std::string& dir) {
  const std::string path = dir + "/" + kMetaFile;
  ZTRAIN_CHECK_T(IoError, fs::exists(path), "checkpoint ", dir, " has no ", kMetaFile,
                 " (it is incomplete: the save did not finish)");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(ReadText(path));
  } catch (const nlohmann::json::exception& e) {
    throw IoError(StrCat(kMetaFile, ": not valid JSON (the file is corrupt): ", e.what()));
  }
  ZTRAIN_CHECK_T(IoError, meta.is_object() && meta.value("format", "") == "ztrain-checkpoint",
                 kMetaFile, ": not a ztrain checkpoint's metadata");
  const nlohmann::json recorded = meta.value("meta_crc32c", nlohmann::json());
  if (recorded.is_null()) {
    ZTRAIN_CHECK_T(IoError, meta.value("version", 0) < 2, kMetaFile,
                   ": version 2 metadata without its meta_crc32c (the file was edited)");
    Log().warn(
        "checkpoint {} was written before meta.json had a checksum (version 1): its "
        "metadata is not checked",
        dir);
    return meta;
  }
  meta.erase("meta_crc32c");
  const std::string text = meta.dump();
  const uint32_t crc = Crc32c(text.data(), text.size());
  ZTRAIN_CHECK_T(
      IoError, recorded.is_number_unsigned() && recorded.get<uint32_t>() == crc,
      fmt::format("{}: checksum {:#010x}, the file says {} (it was edited or is corrupt)",
                  kMetaFile, crc,
                  recorded.is_number_unsigned() ? fmt::format("{:#010x}", recorded.get<uint32_t>())
                                                : recorded.dump()));
  return meta;
}

void WriteMeta(const std::string& dir, const nlohmann::json& meta) {
  nlohmann::json checked = meta;
  checked.erase("meta_crc32c");
  const std::string text = checked.dump();
  checked["meta_crc32c"] = Crc32c(text.data(), text.size());
  WriteFileAtomically(dir, kMetaFile, checked.dump(2) + "\n");
}

std::string VerifyFiles(const std::string& dir, const nlohmann::json& meta, int first, int stride) {
  const nlohmann::json& files = meta.at("files");
  std::vector<char> buffer(size_t{8} << 20);
  for (size_t f = static_cast<size_t>(first); f < files.size(); f += static_cast<size_t>(stride)) {
    const std::string name = files[f].at("name");
    const std::string path = dir + "/" + name;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return StrCat(name, ": missing (", Errno(), ")");
    struct stat st {};
    ::fstat(fd, &st);
    const int64_t expected = files[f].at("bytes");
    if (st.st_size != expected) {
      ::close(fd);
      return StrCat(name, ": ", st.st_size, " bytes, meta.json says ", expected,
                    " (the file is truncated or was replaced)");
    }
    uint32_t crc = 0;
    for (int64_t at = 0; at < expected;) {
      const ssize_t n = ::pread(fd, buffer.data(), buffer.size(), at);
      if (n <= 0) {
        ::close(fd);
        return StrCat(name, ": read failed at offset ", at, " (", Errno(), ")");
      }
      crc = Crc32c(buffer.data(), static_cast<size_t>(n), crc);
      at += n;
    }
    ::close(fd);
    const uint32_t recorded = files[f].at("crc32c");
    if (crc != recorded) {
      return fmt::format("{}: checksum {:#010x}, meta.json says {:#010x} (the file is corrupt)",
                         name, crc, recorded);
    }
  }
  return "";
}

std::vector<int64_t> ListSteps(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const int64_t step = StepOf(entry.path().filename().string());
    if (step >= 0 && fs::exists(entry.path() / kMetaFile)) steps.push_back(step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

int64_t ReadLatest(const std::string& root, std::string* problem) {
  const std::string path = root + "/" + kLatestFile;
  if (!fs::exists(path)) return -1;
  std::string text = ReadText(path);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  const int64_t step = StepOf(text);
  if (step < 0 && problem) {
    *problem = StrCat(path, " holds '", text.substr(0, 40), text.size() > 40 ? "...'" : "'",
                      ", not step<N>");
  }
  return step;
}

std::string NothingToResume(const std::string& root) {
  return StrCat("--resume: checkpoint.dir '", root, "' holds no checkpoint (no step<N> with a ",
                kMetaFile, "), so there is nothing to resume; check that checkpoint.dir is the "
                "directory the earlier run saved into, or leave out --resume to start a new run");
}

std::vector<int64_t> ResumeCandidates(const std::string& root, std::string* latest_problem) {
  const int64_t latest = ReadLatest(root, latest_problem);
  const std::vector<int64_t> steps = ListSteps(root);
  std::vector<int64_t> candidates;
  if (latest >= 0) {
    if (std::find(steps.begin(), steps.end(), latest) != steps.end() ||
        fs::exists(fs::path(root) / StepName(latest))) {
      candidates.push_back(latest);
    } else if (latest_problem) {
      *latest_problem =
          StrCat(root, "/", kLatestFile, " names ", StepName(latest), ", which is not there");
    }
  }
  for (int64_t s : steps) {
    if (s != latest) candidates.push_back(s);
  }
  return candidates;
}

void WriteLatest(const std::string& root, int64_t step) {
  WriteFileAtomically(root, kLatestFile, StepName(step) + "\n");
}

void Prune(const std::string& root, int keep,
           const std::function<bool(const nlohmann::json& meta)>& ours) {
  const int64_t latest = ReadLatest(root);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 8 && name.rfind(".partial") == name.size() - 8) {
      fs::remove_all(entry.path(), ec);  // a save that did not finish
    }
  }
  std::vector<int64_t> steps;
  for (int64_t s : ListSteps(root)) {
    bool other = false;
    if (ours) {
      try {
        other = !ours(ReadMeta((fs::path(root) / StepName(s)).string()));
      } catch (const std::exception&) {
        other = false;  // unreadable metadata: a broken checkpoint of this run, prunable
      }
    }
    if (other) {
      Log().debug("checkpoint: keeping {}: it holds another model (its config differs in shape "
                 "or LoRA adapters)", StepName(s));
    } else {
      steps.push_back(s);
    }
  }
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < steps.size(); ++i) {
    if (steps[i] == latest) continue;
    fs::remove_all(fs::path(root) / StepName(steps[i]), ec);
    if (ec) Log().warn("checkpoint: cannot remove {}: {}", StepName(steps[i]), ec.message());
  }
}

}  // namespace ztrain::checkpoint
