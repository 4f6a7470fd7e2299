#pragma once
// Hugging Face tokenizer.json files (the `tokenizers` library's format) for `ztrain data
// --tokenizer` (issue 20). It reads BPE in the two forms models ship:
//
// Byte-level BPE, as GPT-2, Llama-3 and Qwen2 write it:
//   - model: {"type": "BPE", "vocab": {token: id}, "merges": ["a b", ...] or [["a", "b"], ...]}
//     with ignore_merges (Llama-3: a pre-token that is a vocabulary entry is that token)
//     (no dropout, no continuing_subword_prefix / end_of_word_suffix);
//   - pre_tokenizer: {"type": "ByteLevel", "use_regex": true} (GPT-2's pattern), or a
//     "Sequence" of "Split" ({"pattern": {"Regex": ...}, "behavior": "Isolated"}) and
//     "ByteLevel" ({"use_regex": false}) pre-tokenizers, as Llama-3's and Qwen2's files have;
//     ByteLevel's add_prefix_space is honoured;
//   - normalizer: null or NFC (refused: any other; NFC text is taken as given: ztrain does not
//     normalise, so NFC-normalised input is the caller's);
//   - decoder: ByteLevel (implied).
// BPE with byte fallback, as transformers converts Llama-2's and Mistral's SentencePiece
// models (data/hf_metaspace.h):
//   - model: BPE with "byte_fallback": true and <0x00>..<0xFF> in the vocabulary (fuse_unk and
//     unk_token are then never needed; no ignore_merges);
//   - normalizer Sequence[Prepend("▁"), Replace(" " -> "▁")] and no pre_tokenizer (Llama-2), or
//     no normalizer and a Metaspace pre_tokenizer (replacement "▁", any prepend_scheme, split);
//   - decoder: Replace("▁" -> " "), ByteFallback, Fuse, Strip (implied).
// Both:
//   - added_tokens: matched in the raw text before normalization and pre-tokenization, longest
//     first (with byte_fallback, a token with "normalized": true is refused);
//   - post_processor: TemplateProcessing's special tokens (below).
// Anything else is refused by name (ConfigError naming the key, the value and what is read).
// Regular expressions run on PCRE2 with Unicode properties (\p{L}, \p{N}) and its JIT.
//
// Byte-level BPE: each pre-token's UTF-8 bytes are mapped to printable code points (GPT-2's
// bytes_to_unicode), then adjacent symbols are merged, lowest merge rank first, until no pair
// has a rank; each final symbol is a vocabulary entry. Decode maps back. Byte fallback BPE
// merges characters instead (data/hf_metaspace.h). Thread safe after construction (the encode
// cache is per thread).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace ztrain::data {

class HfTokenizer final : public Tokenizer {
 public:
  // `path`: a tokenizer.json file, or a directory holding one. IoError for a file that
  // cannot be read or is not JSON; ConfigError for what this reader does not support.
  explicit HfTokenizer(const std::string& path);
  ~HfTokenizer();
  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;

  // Token ids of UTF-8 `text` (invalid UTF-8: Error naming the byte offset).
  std::vector<int32_t> Encode(std::string_view text) const override;
  // Text of `ids` (an id outside the vocabulary: Error naming it).
  std::string Decode(std::span<const int32_t> ids) const override;
  // One more than the largest id (vocabulary and added tokens).
  int64_t vocab_size() const override;
  // The id of `token` (a vocabulary entry or an added token), or -1.
  int32_t TokenId(std::string_view token) const override;
  // "tokenizer.json byte-level BPE", "tokenizer.json BPE with byte fallback (<form>)".
  std::string kind() const override;

  // The special tokens the file's post_processor (TemplateProcessing, alone or in a Sequence)
  // puts before and after a single text: Note [Document tokens], data/tokenizer.h.
  const std::vector<int32_t>& template_before() const;
  const std::vector<int32_t>& template_after() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ztrain::data
