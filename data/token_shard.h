#pragma once
// Token shards in llm.c's `.bin` format, and glob expansion of shard patterns.
//
// Format (little endian, as llm.c's dev/data/data_common.py write_datafile writes it): a
// 1024-byte header of 256 int32 — header[0] = magic, header[1] = version, header[2] = token
// count (>= 1), the rest zero — followed by exactly `count` tokens. Two formats, which llm.c
// names after the models it made them for (HEADERS_INFO):
//   "gpt-2":   magic 20240520, version 1, uint16 tokens (llmc/dataloader.h reads these);
//   "llama-3": magic 20240801, version 7, uint32 tokens (train_llama3.py reads these).
// The header says which; a writer picks by the vocabulary (Note [Token format by vocabulary],
// data/token_format.h).
//
// TokenShard maps a shard read-only (shards can hold 100M+ tokens; pages load on demand)
// after validating the header and the file size; it is move-only and unmaps on destruction.
// Every failure is an IoError naming the file and what was found. WriteTokenShard writes to
// `path + ".tmp"` and renames, so a crash never leaves a half-written shard under `path`.
// Thread safety: a TokenShard is immutable after Open and may be read from any thread.
#include <cstdint>
#include <string>
#include <vector>

#include "data/token_format.h"

namespace ztrain::data {

inline constexpr int32_t kUint16ShardMagic = 20240520;
inline constexpr int32_t kUint16ShardVersion = 1;
inline constexpr int32_t kUint32ShardMagic = 20240801;
inline constexpr int32_t kUint32ShardVersion = 7;
inline constexpr int kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// Writes `tokens` (1 to 2^31-1 of them, stored in either format) as one shard at `path` in
// `format`. IoError naming the first token when `format` is uint16 and a token is above
// 65,535; nothing is written then.
void WriteTokenShard(const std::string& path, TokenSpan tokens, TokenFormat format);

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

  TokenSpan tokens() const;
  TokenFormat format() const { return format_; }
  int64_t size() const { return count_; }
  const std::string& path() const { return path_; }

 private:
  void Unmap() noexcept;

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const void* tokens_ = nullptr;
  int64_t count_ = 0;
  TokenFormat format_ = TokenFormat::kUint16;
};

// The files matching `pattern` (glob(3) syntax), sorted bytewise. A pattern without
// wildcards names one file. Throws IoError naming the pattern, and `usage` (what the pattern
// is for, with an example) when nothing matches.
std::vector<std::string> ExpandGlob(
    const std::string& pattern,
    const std::string& usage = "data.train / data.val take a glob such as 'dir/*_train_*.bin'");

}  // namespace ztrain::data
