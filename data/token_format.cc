#include "data/token_format.h"

namespace ztrain::data {

const char* TokenFormatName(TokenFormat format) {
  return format == TokenFormat::kUint16 ? "uint16" : "uint32";
}

TokenFormat TokenFormatForVocabulary(int64_t vocab_size) {
  ZTRAIN_ASSERT(vocab_size >= 1, "vocab_size ", vocab_size);
  return vocab_size <= kUint16Vocabulary ? TokenFormat::kUint16 : TokenFormat::kUint32;
}

TokenFormat ChooseTokenFormat(std::string_view choice, int64_t vocab_size,
                              std::string_view option) {
  if (choice == "auto") return TokenFormatForVocabulary(vocab_size);
  if (choice == "uint32") return TokenFormat::kUint32;
  ZTRAIN_CHECK_T(ConfigError, choice == "uint16", option, " must be auto, uint16 or uint32, got '",
                 choice, "'");
  ZTRAIN_CHECK_T(ConfigError, vocab_size <= kUint16Vocabulary, option,
                 " uint16 cannot hold this tokenizer's ids: its vocabulary has ", vocab_size,
                 " ids and uint16 stores ids below ", kUint16Vocabulary, "; use ", option,
                 " uint32 (or auto, which picks uint32 above ", kUint16Vocabulary, " ids)");
  return TokenFormat::kUint16;
}

}  // namespace ztrain::data
