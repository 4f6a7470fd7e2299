#pragma once
// Token shards in llm.c's `.bin` format, and glob expansion of shard patterns.
//
// Format (little endian, as llm.c's dev/data/data_common.py writes it): a 1024-byte header of
// 256 int32 — header[0] = 20240520 (magic), header[1] = 1 (version: uint16 tokens),
// header[2] = token count (>= 1), the rest zero — followed by exactly `count` uint16 tokens.
//
// TokenShard maps a shard read-only (shards can hold 100M+ tokens; pages load on demand)
// after validating the header and the file size; it is move-only and unmaps on destruction.
// Every failure is an IoError naming the file and what was found. WriteTokenShard writes to
// `path + ".tmp"` and renames, so a crash never leaves a half-written shard under `path`.
// Thread safety: a TokenShard is immutable after Open and may be read from any thread.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ztrain::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// Writes `tokens` (1 to 2^31-1 of them) as one shard at `path`.
void WriteTokenShard(const std::string& path, std::span<const uint16_t> tokens);

class TokenShard {
 public:
  // Maps and validates the shard at `path`.
  static TokenShard Open(const std::string& path);

  TokenShard() = default;
  ~TokenShard() { Unmap(); }
  TokenShard(TokenShard&& other) noexcept { *this = std::move(other); }
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  std::span<const uint16_t> tokens() const { return {tokens_, static_cast<size_t>(count_)}; }
  int64_t size() const { return count_; }
  const std::string& path() const { return path_; }

 private:
  void Unmap() noexcept;

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
};

// The files matching `pattern` (glob(3) syntax), sorted bytewise. A pattern without
// wildcards names one file. Throws IoError naming the pattern when nothing matches.
std::vector<std::string> ExpandGlob(const std::string& pattern);

}  // namespace ztrain::data
