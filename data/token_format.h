#pragma once
// How token ids are stored: TokenFormat (uint16 or uint32 ids, llm.c's two shard formats) and
// TokenSpan, a read-only view of tokens in either format.
//
// Note [Token format by vocabulary]: a writer stores uint16 ids when every id of the
// vocabulary fits (vocab_size <= 65,536: GPT-2's 50,257) and uint32 ids otherwise (Llama-3's
// 128,256). TokenFormatForVocabulary is that rule; every writer picks its format through it
// (or through ChooseTokenFormat, which adds the user's override), never by looking at the
// largest id it happens to write, so all shards of one tokenizer share a format.
//
// A TokenSpan does not own its tokens (a mapped shard or a vector does); it is as valid as they
// are. Readers widen to the loader's int32 through Visit (one loop per format, no branch per
// token) or operator[]. Pure values and functions; thread safe.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace ztrain::data {

enum class TokenFormat { kUint16, kUint32 };

// The number of ids uint16 tokens can hold (0 .. 65,535).
inline constexpr int64_t kUint16Vocabulary = int64_t{1} << 16;

// "uint16" or "uint32".
const char* TokenFormatName(TokenFormat format);
// Bytes per token: 2 or 4.
inline int TokenBytes(TokenFormat format) { return format == TokenFormat::kUint16 ? 2 : 4; }

// Note [Token format by vocabulary]: uint16 for vocab_size <= 65,536, else uint32.
TokenFormat TokenFormatForVocabulary(int64_t vocab_size);

// The format a writer of a `vocab_size` tokenizer uses for the user's `choice`: "auto"
// (TokenFormatForVocabulary), "uint16" or "uint32". ConfigError, naming `option` (e.g.
// "--token-format") and the fix, for another word or for uint16 when the vocabulary has ids
// above 65,535.
TokenFormat ChooseTokenFormat(std::string_view choice, int64_t vocab_size, std::string_view option);

class TokenSpan {
 public:
  TokenSpan() = default;
  TokenSpan(std::span<const uint16_t> tokens)  // NOLINT(google-explicit-constructor)
      : data_(tokens.data()), size_(tokens.size()), format_(TokenFormat::kUint16) {}
  TokenSpan(std::span<const uint32_t> tokens)  // NOLINT(google-explicit-constructor)
      : data_(tokens.data()), size_(tokens.size()), format_(TokenFormat::kUint32) {}
  TokenSpan(const std::vector<uint16_t>& v)  // NOLINT(google-explicit-constructor)
      : TokenSpan(std::span<const uint16_t>(v)) {}
  TokenSpan(const std::vector<uint32_t>& v)  // NOLINT(google-explicit-constructor)
      : TokenSpan(std::span<const uint32_t>(v)) {}

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  TokenFormat format() const { return format_; }

  uint32_t operator[](size_t i) const {
    return format_ == TokenFormat::kUint16 ? static_cast<const uint16_t*>(data_)[i]
                                           : static_cast<const uint32_t*>(data_)[i];
  }

  // The tokens as stored; T must be the span's format (uint16_t or uint32_t).
  template <class T>
  std::span<const T> As() const {
    static_assert(std::is_same_v<T, uint16_t> || std::is_same_v<T, uint32_t>);
    constexpr TokenFormat kWanted =
        std::is_same_v<T, uint16_t> ? TokenFormat::kUint16 : TokenFormat::kUint32;
    ZTRAIN_ASSERT(format_ == kWanted, "TokenSpan holds ", TokenFormatName(format_), " tokens");
    return {static_cast<const T*>(data_), size_};
  }

  // f(std::span<const uint16_t>) or f(std::span<const uint32_t>), by the format.
  template <class F>
  decltype(auto) Visit(F&& f) const {
    if (format_ == TokenFormat::kUint16) return f(As<uint16_t>());
    return f(As<uint32_t>());
  }

  // The tokens widened to uint32 (a copy).
  std::vector<uint32_t> ToVector() const {
    return Visit([](auto t) { return std::vector<uint32_t>(t.begin(), t.end()); });
  }

 private:
  const void* data_ = nullptr;
  size_t size_ = 0;
  TokenFormat format_ = TokenFormat::kUint16;
};

}  // namespace ztrain::data
