#pragma once
// SentencePiece-style BPE in Hugging Face tokenizer.json files (model.byte_fallback: true), as
// transformers converts Llama-2's and Mistral's tokenizer.model; a part of data::HfTokenizer
// (data/hf_tokenizer.h), which owns one when the file has byte_fallback.
//
// Spaces become "▁" (U+2581) and a "▁" goes before the text, either by the normalizer
// (Llama-2's file: Sequence[Prepend("▁"), Replace(" " -> "▁")], the prefix on every text
// between added tokens) or by a Metaspace pre-tokenizer (newer files: normalizer null;
// prepend_scheme "first" (only at the start of the text) or "always", each only when the text
// does not start with "▁" already; split false, or true: each "▁" starts a word). BPE then
// merges Unicode characters, not bytes; a character the vocabulary lacks becomes the <0xXX>
// tokens of its UTF-8 bytes (byte fallback), as the `tokenizers` library does.
//
// Without Metaspace's split, the `tokenizers` library runs BPE over the whole text between
// added tokens; this splits it into words only where no merge can cross (before a "▁" that
// follows another character, when no vocabulary entry holds such a "▁"), which gives the
// same tokens (merges apply lowest rank first, leftmost first, within a word as across).
//
// Decode undoes what Encode adds: "▁" back to spaces, <0xXX> runs back to their bytes (as
// they are: an incomplete UTF-8 sequence is not replaced by U+FFFD, so text decoded in parts
// joins up), and the "▁" prefix taken off where Encode puts one: at the start of the text, and
// after each added token when every text between them gets one (HF's Strip decoder takes off
// only the first).
//
// ConfigError names anything else (another normalizer or pre-tokenizer, another replacement
// than "▁", a vocabulary without the 256 byte tokens). Immutable after construction; thread
// safe.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ztrain::data::detail {

// BPE merges: (left id, right id) -> (rank, merged id).
using MergeMap = std::unordered_map<uint64_t, std::pair<int32_t, int32_t>>;

inline uint64_t MergeKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

class MetaspaceBpe {
 public:
  // Where the "▁" prefix goes.
  enum class Prefix {
    kNone,            // no Prepend normalizer; Metaspace prepend_scheme "never"
    kEachText,        // Prepend normalizer: every non-empty text between added tokens
    kEachUnlessSet,   // Metaspace "always": every text not starting with "▁"
    kFirstUnlessSet,  // Metaspace "first": the text at the start, unless it starts with "▁"
  };

  // The file's normalizer and pre_tokenizer (null when absent) and the model's vocabulary.
  MetaspaceBpe(const nlohmann::json& normalizer, const nlohmann::json& pre_tokenizer,
               const std::unordered_map<std::string, int32_t>& vocab);

  // The normalized form of `text` (between added tokens); `at_start`: it starts the input.
  std::string Normalize(std::string_view text, bool at_start) const;
  // The words of `normalized` that BPE encodes one by one.
  std::vector<std::string_view> Words(std::string_view normalized) const;
  // BPE over the characters of `word`, with byte fallback; appends the ids.
  void EncodeWord(std::string_view word, const MergeMap& merges, std::vector<int32_t>& out) const;
  // Appends the text of vocabulary entry `id` (`token`); `strip`: take off a leading "▁".
  void AppendText(int32_t id, std::string_view token, bool strip, std::string& out) const;

  // Whether Decode takes a "▁" off the start of the text, and after each added token.
  bool strips_at_start() const { return prefix_ != Prefix::kNone; }
  bool strips_after_added() const {
    return prefix_ == Prefix::kEachText || prefix_ == Prefix::kEachUnlessSet;
  }
  // For messages: "Prepend/Replace normalizer", "Metaspace (prepend_scheme first)".
  const std::string& form() const { return form_; }

 private:
  void ReadNormalizer(const nlohmann::json& normalizer);
  void ReadMetaspace(const nlohmann::json& pre_tokenizer);

  Prefix prefix_ = Prefix::kNone;
  bool split_at_each_ = false;  // Metaspace split: true
  bool split_safe_ = false;     // no vocabulary entry has "▁" after another character
  std::string form_;
  std::unordered_map<uint32_t, int32_t> char_ids_;  // one-character vocabulary entries
  std::vector<int32_t> byte_ids_;                   // <0x00>..<0xFF>
  std::unordered_map<int32_t, uint8_t> id_bytes_;
};

}  // namespace ztrain::data::detail
