#pragma once
// The byte-level tokenizer behind `ztrain data --text FILE --out SHARD`.
//
// A token is one byte of the UTF-8 text (0..255), so a model trained on these shards needs
// vocab_size >= 256. Text must be valid UTF-8 (RFC 3629: no overlong forms, surrogates or
// code points above U+10FFFF); the first invalid byte is reported by offset. Failures are
// IoError (files) or Error (encoding). Pure functions; thread safe.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/token_format.h"

namespace ztrain::data {

// Token ids 0..255: the vocabulary a model needs at least, and what picks the shard format
// (Note [Token format by vocabulary], data/token_format.h: uint16).
inline constexpr int64_t kByteVocabularySize = 256;

// Text longer than this is split into several shards (TextToShard).
inline constexpr int64_t kMaxTextShardTokens = 100'000'000;

// The byte offset of the first byte that breaks UTF-8 in `text`, or -1 when it is valid.
int64_t FindInvalidUtf8(std::string_view text);

// Tokens of `text`: one per byte.
std::vector<uint16_t> EncodeBytes(std::string_view text);

// Tokenizes the UTF-8 file `text_path` and writes llm.c shards of `format` tokens; returns the
// token count. Up to `max_shard_tokens` tokens go to `shard_path` itself. Longer text is split into
// shards of `max_shard_tokens` tokens named after `shard_path` without its ".bin" extension plus
// "_000000.bin", "_000001.bin", ... (out.bin -> out_000000.bin, out_000001.bin), which the
// glob "out_*.bin" reads back in order. The file must be non-empty, valid UTF-8, and not one
// of the files it would write (ConfigError: the input is never overwritten); nothing is
// written when it is not.
int64_t TextToShard(const std::string& text_path, const std::string& shard_path, TokenFormat format,
                    int64_t max_shard_tokens = kMaxTextShardTokens);

// The path of shard `index` when TextToShard splits `shard_path`.
std::string SplitShardPath(const std::string& shard_path, int64_t index);

// Text of byte tokens, for printing samples. Tokens outside 0..255 (a model's vocabulary is
// often padded beyond 256) become U+FFFD. The result need not be valid UTF-8 when the model
// emits broken byte sequences.
std::string Decode(std::span<const int32_t> tokens);

}  // namespace ztrain::data
