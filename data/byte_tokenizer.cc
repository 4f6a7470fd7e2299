#include "data/byte_tokenizer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "data/token_shard.h"

namespace ztrain::data {
namespace {

// Checks the UTF-8 sequence starting at text[i]. Returns its length, or 0 and sets *bad to
// the offset of the first byte that cannot belong to it (the lead byte when the text ends
// inside the sequence).
size_t Utf8SequenceLength(std::string_view text, size_t i, size_t* bad) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return 1;
  *bad = i;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // UTF-16 surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;  // a stray continuation byte, an overlong lead C0/C1, or F5..FF
  }
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= text.size()) {
      *bad = i;
      return 0;
    }
    *bad = i + k;
    const unsigned char b = byte(i + k);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
  }
  return len;
}

std::string HexByte(char c) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(c)));
  return buf;
}

// A read-only view of a whole file (mapped; empty files are not mapped).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ZTRAIN_CHECK_T(IoError, fd >= 0, "cannot open text file '", path, "': ", std::strerror(errno));
    struct stat st {};
    const bool ok = ::fstat(fd, &st) == 0;
    size_ = ok ? static_cast<size_t>(st.st_size) : 0;
    void* map = ok && size_ > 0 ? ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
    const int err = errno;
    ::close(fd);
    ZTRAIN_CHECK_T(IoError, ok && map != MAP_FAILED, "cannot read text file '", path,
                   "': ", std::strerror(err));
    data_ = map;
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view text() const { return {static_cast<const char*>(data_), data_ ? size_ : 0}; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

int64_t FindInvalidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    size_t bad = 0;
    const size_t len = Utf8SequenceLength(text, i, &bad);
    if (len == 0) return static_cast<int64_t>(bad);
    i += len;
  }
  return -1;
}

std::vector<uint16_t> EncodeBytes(std::string_view text) {
  std::vector<uint16_t> tokens(text.size());
  std::transform(text.begin(), text.end(), tokens.begin(),
                 [](char c) { return static_cast<uint16_t>(static_cast<unsigned char>(c)); });
  return tokens;
}

std::string SplitShardPath(const std::string& shard_path, int64_t index) {
  std::string stem = shard_path;
  if (stem.size() >= 4 && stem.compare(stem.size() - 4, 4, ".bin") == 0)
    stem.resize(stem.size() - 4);
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "_%06lld.bin", static_cast<long long>(index));
  return stem + suffix;
}

int64_t TextToShard(const std::string& text_path, const std::string& shard_path, TokenFormat format,
                    int64_t max_shard_tokens) {
  ZTRAIN_CHECK(max_shard_tokens >= 1 && max_shard_tokens <= kMaxTextShardTokens,
               "max_shard_tokens must be in [1, ", kMaxTextShardTokens, "], got ",
               max_shard_tokens);
  const MappedFile file(text_path);
  const std::string_view text = file.text();
  ZTRAIN_CHECK_T(IoError, !text.empty(), "text file '", text_path,
                 "' is empty: a token shard needs at least one token");
  const int64_t bad = FindInvalidUtf8(text);
  ZTRAIN_CHECK(bad < 0, "text file '", text_path, "' is not valid UTF-8: the byte at offset ", bad,
               " (", HexByte(text[bad < 0 ? 0 : bad]),
               ") cannot appear there; convert the file to UTF-8 (e.g. iconv -t UTF-8)");
  const int64_t total = static_cast<int64_t>(text.size());
  ZTRAIN_CHECK_T(ConfigError, !std::filesystem::is_directory(shard_path), "--out '", shard_path,
                 "' is a directory; give the shard a file name, e.g. '",
                 (std::filesystem::path(shard_path) / "data.bin").string(), "'");
  // Never overwrite the input: a shard written over the text would replace it.
  const int64_t shards = (total + max_shard_tokens - 1) / max_shard_tokens;
  for (int64_t i = 0; i < shards; ++i) {
    const std::string out = shards == 1 ? shard_path : SplitShardPath(shard_path, i);
    std::error_code ec;
    ZTRAIN_CHECK_T(ConfigError, !std::filesystem::equivalent(out, text_path, ec), "--out '",
                   shard_path, "' would write ", out,
                   ", which is the text file --text "
                   "reads: the shard would replace it; give --out another name, e.g. '",
                   text_path + ".bin", "'");
  }
  if (total <= max_shard_tokens) {
    WriteTokenShard(shard_path, EncodeBytes(text), format);
    return total;
  }
  for (int64_t begin = 0, index = 0; begin < total; begin += max_shard_tokens, ++index) {
    const size_t len = static_cast<size_t>(std::min(max_shard_tokens, total - begin));
    WriteTokenShard(SplitShardPath(shard_path, index), EncodeBytes(text.substr(begin, len)),
                    format);
  }
  return total;
}

std::string Decode(std::span<const int32_t> tokens) {
  std::string out;
  out.reserve(tokens.size());
  for (int32_t t : tokens) {
    if (t >= 0 && t < 256) {
      out.push_back(static_cast<char>(t));
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
    }
  }
  return out;
}

}  // namespace ztrain::data
