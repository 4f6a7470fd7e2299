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
#include <span>
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

int32_t Magic(TokenFormat format) {
  return format == TokenFormat::kUint16 ? kUint16ShardMagic : kUint32ShardMagic;
}

int32_t Version(TokenFormat format) {
  return format == TokenFormat::kUint16 ? kUint16ShardVersion : kUint32ShardVersion;
}

// The two formats ztrain reads, for error messages.
std::string KnownFormats() {
  return detail::StrCat("magic ", kUint16ShardMagic, " version ", kUint16ShardVersion,
                        " (uint16 tokens, llm.c's gpt-2 format) or magic ", kUint32ShardMagic,
                        " version ", kUint32ShardVersion,
                        " (uint32 tokens, llm.c's llama-3 format)");
}

// The format that header[0] (magic) and header[1] (version) name.
TokenFormat HeaderFormat(const int32_t* header, const std::string& path) {
  for (TokenFormat format : {TokenFormat::kUint16, TokenFormat::kUint32}) {
    if (header[0] == Magic(format) && header[1] == Version(format)) return format;
  }
  const bool known_magic = header[0] == kUint16ShardMagic || header[0] == kUint32ShardMagic;
  ZTRAIN_CHECK_T(IoError, known_magic, "token shard '", path, "' has bad magic ", header[0],
                 " (expected ", KnownFormats(), "): ", MagicHint(header[0]));
  throw IoError(detail::StrCat("token shard '", path, "' has magic ", header[0],
                               " with unsupported version ", header[1], " (ztrain reads ",
                               KnownFormats(), "); re-run the data preprocessing"));
}

// Checks the header against the file's size; returns the format of its tokens.
TokenFormat CheckHeader(const int32_t* header, int64_t file_bytes, const std::string& path) {
  const TokenFormat format = HeaderFormat(header, path);
  const int64_t count = header[2];
  ZTRAIN_CHECK_T(IoError, count >= 1, "token shard '", path, "' declares ", count,
                 " tokens; a shard must hold at least 1");
  const int64_t expected = kShardHeaderBytes + TokenBytes(format) * count;
  if (file_bytes == expected) return format;
  const TokenFormat other =
      format == TokenFormat::kUint16 ? TokenFormat::kUint32 : TokenFormat::kUint16;
  const bool other_fits = file_bytes == kShardHeaderBytes + TokenBytes(other) * count;
  throw IoError(detail::StrCat(
      "token shard '", path, "' is ",
      file_bytes < expected ? "truncated" : "longer than its header says", ": ", count, " ",
      TokenFormatName(format), " tokens need ", expected, " bytes, the file has ", file_bytes,
      other_fits ? detail::StrCat(" (what ", count, " ", TokenFormatName(other),
                                  " tokens fill: the header names the wrong format; re-run the "
                                  "data preprocessing)")
                 : ""));
}

// IoError naming the first token above 65,535 when `tokens` are to be written as uint16.
void CheckFitsUint16(TokenSpan tokens, const std::string& path) {
  if (tokens.format() == TokenFormat::kUint16) return;
  const std::span<const uint32_t> t = tokens.As<uint32_t>();
  const auto bad =
      std::find_if(t.begin(), t.end(), [](uint32_t x) { return x >= kUint16Vocabulary; });
  ZTRAIN_CHECK_T(IoError, bad == t.end(), "cannot write token ", *bad, " at index ",
                 bad - t.begin(), " to the uint16 token shard '", path,
                 "': uint16 holds ids below ", kUint16Vocabulary,
                 "; write the uint32 format (the tokenizer's vocabulary picks "
                 "it, data/token_format.h)");
}

// Writes `in` as tokens of type Out, a block at a time (no second copy of a whole shard).
template <class Out, class In>
void WriteConverted(int fd, std::span<const In> in, const std::string& path) {
  constexpr size_t kBlock = size_t{1} << 16;
  std::vector<Out> block;
  for (size_t begin = 0; begin < in.size(); begin += kBlock) {
    const std::span<const In> part = in.subspan(begin, std::min(kBlock, in.size() - begin));
    block.resize(part.size());
    std::transform(part.begin(), part.end(), block.begin(),
                   [](In t) { return static_cast<Out>(t); });
    WriteAll(fd, block.data(), block.size() * sizeof(Out), path);
  }
}

void WriteTokens(int fd, TokenSpan tokens, TokenFormat format, const std::string& path) {
  tokens.Visit([&](auto in) {
    if (tokens.format() == format) {
      WriteAll(fd, in.data(), in.size_bytes(), path);
    } else if (format == TokenFormat::kUint16) {
      WriteConverted<uint16_t>(fd, in, path);
    } else {
      WriteConverted<uint32_t>(fd, in, path);
    }
  });
}

}  // namespace

void WriteTokenShard(const std::string& path, TokenSpan tokens, TokenFormat format) {
  ZTRAIN_CHECK_T(IoError,
                 !tokens.empty() && tokens.size() <= size_t{std::numeric_limits<int32_t>::max()},
                 "cannot write token shard '", path, "' with ", tokens.size(),
                 " tokens: a shard holds 1 to 2^31-1 tokens");
  if (format == TokenFormat::kUint16) CheckFitsUint16(tokens, path);
  int32_t header[kShardHeaderInts] = {};
  header[0] = Magic(format);
  header[1] = Version(format);
  header[2] = static_cast<int32_t>(tokens.size());

  const std::string tmp = path + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  ZTRAIN_CHECK_T(IoError, fd.get() >= 0, "cannot create '", tmp, "': ", ErrnoText());
  try {
    WriteAll(fd.get(), header, sizeof(header), tmp);
    WriteTokens(fd.get(), tokens, format, tmp);
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
  shard.format_ = CheckHeader(static_cast<const int32_t*>(map), file_bytes, path);
  shard.tokens_ = static_cast<const char*>(map) + kShardHeaderBytes;
  shard.count_ = static_cast<const int32_t*>(map)[2];
  return shard;
}

TokenSpan TokenShard::tokens() const {
  const size_t n = static_cast<size_t>(count_);
  if (format_ == TokenFormat::kUint16) return std::span(static_cast<const uint16_t*>(tokens_), n);
  return std::span(static_cast<const uint32_t*>(tokens_), n);
}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
    format_ = other.format_;
  }
  return *this;
}

void TokenShard::Unmap() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  tokens_ = nullptr;
  count_ = 0;
}

std::vector<std::string> ExpandGlob(const std::string& pattern, const std::string& usage) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  ZTRAIN_CHECK_T(IoError, rc != GLOB_NOMATCH, "no files match the pattern '", pattern,
                 "': check the path (", usage, ")");
  ZTRAIN_CHECK_T(IoError, rc == 0, "cannot expand the pattern '", pattern,
                 "': ", rc == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
  std::sort(paths.begin(), paths.end());  // glob sorts by locale collation; make it bytewise
  return paths;
}

}  // namespace ztrain::data
