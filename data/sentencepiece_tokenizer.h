#pragma once
// SentencePiece `.model` files (Llama-2's and Mistral's tokenizer.model, T5's, any model
// spm_train writes) for `ztrain data --tokenizer` (issue 20), through Debian's
// libsentencepiece: the library encodes and decodes, so ids are the library's own (BPE or
// unigram, its normalization rule, byte fallback, user-defined symbols).
//
// Owns one sentencepiece::SentencePieceProcessor (behind a pointer: only the .cc includes
// sentencepiece_processor.h). Immutable after loading and thread safe (the library's Encode
// and Decode are const). Fails with IoError naming the file and the library's status when the
// model cannot be loaded; Encode refuses invalid UTF-8 (Error naming the byte offset), Decode
// an id outside the vocabulary.
//
// Encode adds no BOS/EOS: the corpus adds document tokens (Note [Document tokens],
// data/tokenizer.h; a model's own BOS is its rule when no tokenizer_config.json says
// otherwise). Decode writes control pieces (<s>, </s>) as their text, which the library
// would drop; the text between them is the library's decode (one run each, so the dummy
// prefix space the library adds to each encoded text is taken off each run).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace ztrain::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // `path`: a SentencePiece model file (tokenizer.model, spm_train's <prefix>.model).
  explicit SentencePieceTokenizer(const std::string& path);
  ~SentencePieceTokenizer();
  SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;

  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string Decode(std::span<const int32_t> ids) const override;
  // The number of pieces.
  int64_t vocab_size() const override;
  // The id of the piece `token`, or -1 (the library answers unk for any unknown piece).
  int32_t TokenId(std::string_view token) const override;
  // "SentencePiece bpe model", "SentencePiece unigram model" (the trainer's model_type).
  std::string kind() const override;

  // The model's BOS and EOS ids, or -1 when it has none (spm_train --bos_id=-1).
  int32_t bos_id() const;
  int32_t eos_id() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ztrain::data
