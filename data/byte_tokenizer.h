#pragma once
// Byte tokens and UTF-8: what `ztrain data` without --tokenizer writes (one token per byte of
// the UTF-8 text, 0..255, so a model trained on them needs vocab_size >= 256), and the UTF-8
// checks every tokenizer relies on (RFC 3629: no overlong forms, surrogates or code points
// above U+10FFFF). Pure functions; thread safe.
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

// The byte offset of the first byte that breaks UTF-8 in `text`, or -1 when it is valid.
int64_t FindInvalidUtf8(std::string_view text);

// Python's bytes.decode("utf-8", errors="replace") on `text`: each maximal subsequence that
// is no valid UTF-8 (Unicode's "substitution of maximal subparts") becomes U+FFFD. Returns
// the number of replacements; when above 0, `*out` holds the repaired text and `*first` the
// offset of the first replaced byte (both untouched otherwise).
int64_t ReplaceInvalidUtf8(std::string_view text, std::string* out, int64_t* first);

// Tokens of `text`: one per byte.
std::vector<uint16_t> EncodeBytes(std::string_view text);

// The path of shard `index` when a corpus is split into shards (Note [Corpus shards],
// data/corpus.h): out.bin -> out_000000.bin, out_000001.bin, ...
std::string SplitShardPath(const std::string& shard_path, int64_t index);

// Text of byte tokens, for printing samples. Tokens outside 0..255 (a model's vocabulary is
// often padded beyond 256) become U+FFFD. The result need not be valid UTF-8 when the model
// emits broken byte sequences.
std::string Decode(std::span<const int32_t> tokens);

}  // namespace ztrain::data
