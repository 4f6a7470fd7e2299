#include "data/token_shard.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "core/error.h"

namespace ztrain::data {
namespace {

static_assert(std::endian::native == std::endian::little,
              "llm.c shards are little endian; a big-endian host would need byte swaps");

std::string ErrnoText() { return std::strerror(errno); }

// Owns a file descriptor; closes it on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports the result (close can report a delayed write error).
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

void WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    ZTRAIN_CHECK_T(IoError, n > 0, "cannot write token shard '", path, "': ", ErrnoText());
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

// What a wrong magic number most likely means, for the error message.
std::string MagicHint(int32_t magic) {
  switch (magic) {
    case 20240326:
      return "this is an llm.c model checkpoint (magic 20240326), not a token shard";
    case 20240328:
      return "this is an llm.c tokenizer file (magic 20240328), not a token shard";
    case 20240522:
      return "this is an llm.c eval file such as HellaSwag (magic 20240522), not a token shard";
    default:
      return "this may be an llm.c model file or a shard written by another (older or newer) "
             "version of the data preprocessing; re-run the preprocessing";
  }
}

void CheckHeader(const int32_t* header, int64_t file_bytes, const std::string& path) {
  ZTRAIN_CHECK_T(IoError, header[0] == kShardMagic, "token shard '", path, "' has bad magic ",
                 header[0], " (expected ", kShardMagic, "): ", MagicHint(header[0]));
  ZTRAIN_CHECK_T(IoError, header[1] == kShardVersion, "token shard '", path,
                 "' has unsupported version ", header[1], " (ztrain reads version ", kShardVersion,
                 ", uint16 tokens",
                 header[1] == 2 ? "; version 2 holds llm.c's uint32 LLaMA-3 tokens" : "", ")");
  const int64_t count = header[2];
  ZTRAIN_CHECK_T(IoError, count >= 1, "token shard '", path, "' declares ", count,
                 " tokens; a shard must hold at least 1");
  const int64_t expected = kShardHeaderBytes + 2 * count;
  ZTRAIN_CHECK_T(IoError, file_bytes == expected, "token shard '", path, "' is ",
                 file_bytes < expected ? "truncated" : "longer than its header says", ": ", count,
                 " tokens need ", expected, " bytes, the file has ", file_bytes);
}

}  // namespace

void WriteTokenShard(const std::string& path, std::span<const uint16_t> tokens) {
  ZTRAIN_CHECK_T(IoError,
                 !tokens.empty() && tokens.size() <= size_t{std::numeric_limits<int32_t>::max()},
                 "cannot write token shard '", path, "' with ", tokens.size(),
                 " tokens: a shard holds 1 to 2^31-1 tokens");
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());

  const std::string tmp = path + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  ZTRAIN_CHECK_T(IoError, fd.get() >= 0, "cannot create '", tmp, "': ", ErrnoText());
  try {
    WriteAll(fd.get(), header, sizeof(header), tmp);
    WriteAll(fd.get(), tokens.data(), tokens.size_bytes(), tmp);
    ZTRAIN_CHECK_T(IoError, ::fsync(fd.get()) == 0, "cannot sync '", tmp, "': ", ErrnoText());
    ZTRAIN_CHECK_T(IoError, fd.Close() == 0, "cannot close '", tmp, "': ", ErrnoText());
    ZTRAIN_CHECK_T(IoError, std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp,
                   "' to '", path, "': ", ErrnoText());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

TokenShard TokenShard::Open(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ZTRAIN_CHECK_T(IoError, fd.get() >= 0, "cannot open token shard '", path, "': ", ErrnoText());
  struct stat st {};
  ZTRAIN_CHECK_T(IoError, ::fstat(fd.get(), &st) == 0, "cannot stat '", path, "': ", ErrnoText());
  const int64_t file_bytes = st.st_size;
  ZTRAIN_CHECK_T(IoError, file_bytes >= kShardHeaderBytes, "token shard '", path, "' is ",
                 file_bytes, " bytes, too small for the ", kShardHeaderBytes,
                 "-byte header: not an llm.c token shard, or truncated");

  TokenShard shard;
  shard.path_ = path;
  shard.map_bytes_ = static_cast<size_t>(file_bytes);
  void* map = ::mmap(nullptr, shard.map_bytes_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  ZTRAIN_CHECK_T(IoError, map != MAP_FAILED, "cannot map token shard '", path, "': ", ErrnoText());
  shard.map_ = map;  // owned from here on: unmapped if a check below throws
  CheckHeader(static_cast<const int32_t*>(map), file_bytes, path);
  shard.tokens_ =
      reinterpret_cast<const uint16_t*>(static_cast<const char*>(map) + kShardHeaderBytes);
  shard.count_ = static_cast<const int32_t*>(map)[2];
  return shard;
}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

void TokenShard::Unmap() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  tokens_ = nullptr;
  count_ = 0;
}

std::vector<std::string> ExpandGlob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  ZTRAIN_CHECK_T(IoError, rc != GLOB_NOMATCH, "no files match the pattern '", pattern,
                 "': check the path (data.train / data.val take a glob such as "
                 "'dir/*_train_*.bin')");
  ZTRAIN_CHECK_T(IoError, rc == 0, "cannot expand the pattern '", pattern,
                 "': ", rc == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
  std::sort(paths.begin(), paths.end());  // glob sorts by locale collation; make it bytewise
  return paths;
}

}  // namespace ztrain::data
