#pragma once
// The tokenizers `ztrain data` and sampling use, behind one interface: byte tokens (no
// tokenizer given), a Hugging Face tokenizer.json (data/hf_tokenizer.h) or a SentencePiece
// .model file (data/sentencepiece_tokenizer.h).
//
// Note [Document tokens]: what surrounds each document in a corpus. HF's `tokenizer(text)`
// adds what the model was trained with, so ztrain does the same, in this order of authority:
//   1. tokenizer_config.json beside tokenizer.json, when it says add_bos_token or
//      add_eos_token (Llama-2, Mistral): bos_token before, eos_token after, as it says;
//   2. else the tokenizer.json post_processor's TemplateProcessing "single" template (Llama-3:
//      <|begin_of_text|> before), alone or inside a Sequence; for a SentencePiece .model, its
//      own BOS piece before (transformers' LlamaTokenizer: add_bos_token=True,
//      add_eos_token=False by default);
//   3. else, when neither adds a token (GPT-2, Qwen2), llm.c's rule for pretraining corpora:
//      the end-of-text token (tokenizer_config's eos_token, else a SentencePiece model's EOS
//      piece, else "<|endoftext|>") before each document, so documents never run together.
// The user may replace the rule (--bos, --eos). Byte tokens have no special tokens: documents
// are concatenated as they are.
//
// Tokenizers are immutable after loading and thread safe. Failures: IoError for files,
// ConfigError for what is not supported (named).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ztrain::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of valid UTF-8 `text` (no document tokens added).
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  // Text of `ids`; special tokens as their text.
  virtual std::string Decode(std::span<const int32_t> ids) const = 0;
  // One more than the largest id.
  virtual int64_t vocab_size() const = 0;
  // The id of `token` (a vocabulary entry or special token), or -1.
  virtual int32_t TokenId(std::string_view token) const = 0;
  // For messages and the manifest: "byte", "tokenizer.json BPE", ...
  virtual std::string kind() const = 0;
  // Whether Encode(a + b) == Encode(a) + Encode(b) for every split at a code point boundary,
  // so one long text may be encoded in pieces (byte tokens).
  virtual bool splits_anywhere() const { return false; }
};

// Byte tokens: one id per UTF-8 byte (0..255).
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string Decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return 256; }
  int32_t TokenId(std::string_view token) const override;
  std::string kind() const override { return "byte"; }
  bool splits_anywhere() const override { return true; }
};

// The tokenizer at `path`, or byte tokens when `path` is empty: a SentencePiece model when
// TokenizerFile(path) ends in ".model", else a tokenizer.json.
std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& path);

// The file LoadTokenizer reads for `path`: `path` itself when it is not a directory; in a
// directory, tokenizer.json when there is one (Hugging Face model directories of Llama-2 and
// Mistral hold both, and their tokenizer.json is what `tokenizer(text)` uses), else
// tokenizer.model when there is one, else tokenizer.json (whose absence is then the error).
std::string TokenizerFile(const std::string& path);

// The tokens around each document (Note [Document tokens]) and where that rule came from.
struct DocumentTokens {
  std::vector<int32_t> before;
  std::vector<int32_t> after;
  std::string source;  // e.g. "tokenizer.json post_processor"
  std::string layout;  // e.g. "<|begin_of_text|> + text"
};

// Note [Document tokens] for the tokenizer at `path`. `bos` and `eos`: "auto" (the rule),
// "none", or a token's text, which replaces the rule (both then say what the document gets;
// an unset one is "none"). ConfigError for a token the tokenizer does not hold.
DocumentTokens ReadDocumentTokens(const std::string& path, const Tokenizer& tokenizer,
                                  const std::string& bos = "auto",
                                  const std::string& eos = "auto");

}  // namespace ztrain::data
