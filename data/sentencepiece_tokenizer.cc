#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <string>
#include <utility>

#include "core/error.h"
#include "data/byte_tokenizer.h"

namespace ztrain::data {
namespace {

using ::ztrain::detail::StrCat;

// Protocol-buffer wire format, just enough to read one enum of a serialized ModelProto:
// Debian's libsentencepiece-dev ships no sentencepiece_model.pb.h.
class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : bytes_(bytes) {}

  bool done() const { return at_ >= bytes_.size() || failed_; }

  uint64_t Varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64 && at_ < bytes_.size(); shift += 7) {
      const auto byte = static_cast<unsigned char>(bytes_[at_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    failed_ = true;
    return 0;
  }

  // The next field: its number, wire type, and its bytes (LEN) or value (VARINT).
  bool Next(uint32_t& field, uint32_t& wire_type, std::string_view& payload, uint64_t& value) {
    const uint64_t key = Varint();
    field = static_cast<uint32_t>(key >> 3);
    wire_type = static_cast<uint32_t>(key & 7);
    size_t skip = 0;
    switch (wire_type) {
      case 0:
        value = Varint();
        break;
      case 1:
        skip = 8;
        break;
      case 2:
        skip = static_cast<size_t>(Varint());
        break;
      case 5:
        skip = 4;
        break;
      default:
        failed_ = true;
    }
    if (failed_ || skip > bytes_.size() - at_) {
      failed_ = true;
      return false;
    }
    payload = bytes_.substr(at_, skip);
    at_ += skip;
    return true;
  }

 private:
  std::string_view bytes_;
  size_t at_ = 0;
  bool failed_ = false;
};

// ModelProto.trainer_spec (field 2).model_type (field 3): "unigram" (the default), "bpe",
// "word" or "char".
std::string ModelType(std::string_view model_proto) {
  constexpr const char* kNames[] = {"unigram", "unigram", "bpe", "word", "char"};
  uint64_t type = 1;
  WireReader model(model_proto);
  uint32_t field = 0, wire = 0;
  std::string_view payload;
  uint64_t value = 0;
  while (!model.done() && model.Next(field, wire, payload, value)) {
    if (field != 2 || wire != 2) continue;
    WireReader spec(payload);
    while (!spec.done() && spec.Next(field, wire, payload, value)) {
      if (field == 3 && wire == 0) type = value;
    }
  }
  return type < 5 ? kNames[type] : StrCat("type-", type);
}

}  // namespace

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
  std::string model_type;

  std::string DecodeRun(const std::vector<int>& ids) const {
    std::string text;
    const sentencepiece::util::Status status = processor.Decode(ids, &text);
    ZTRAIN_CHECK(status.ok(), "tokenizer: SentencePiece cannot decode: ", status.ToString());
    return text;
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& path)
    : impl_(std::make_unique<Impl>()) {
  const sentencepiece::util::Status status = impl_->processor.Load(path);
  ZTRAIN_CHECK_T(IoError, status.ok(), "tokenizer: cannot load the SentencePiece model ", path,
                 ": ", status.ToString());
  impl_->model_type = ModelType(impl_->processor.serialized_model_proto());
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept =
    default;

std::vector<int32_t> SentencePieceTokenizer::Encode(std::string_view text) const {
  const int64_t bad = FindInvalidUtf8(text);
  ZTRAIN_CHECK(bad < 0, "tokenizer: the text is not valid UTF-8 at byte ", bad);
  std::vector<int> ids;
  const sentencepiece::util::Status status = impl_->processor.Encode(text, &ids);
  ZTRAIN_CHECK(status.ok(), "tokenizer: SentencePiece cannot encode: ", status.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  std::vector<int> run;
  for (const int32_t id : ids) {
    ZTRAIN_CHECK(id >= 0 && id < vocab_size(), "tokenizer: id ", id,
                 " is outside the vocabulary of ", vocab_size());
    if (!impl_->processor.IsControl(id)) {
      run.push_back(id);
      continue;
    }
    out += impl_->DecodeRun(run);
    run.clear();
    out += impl_->processor.IdToPiece(id);
  }
  return out + impl_->DecodeRun(run);
}

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->processor.GetPieceSize(); }

int32_t SentencePieceTokenizer::TokenId(std::string_view token) const {
  const int id = impl_->processor.PieceToId(token);
  return id >= 0 && impl_->processor.IdToPiece(id) == token ? id : -1;
}

std::string SentencePieceTokenizer::kind() const {
  return "SentencePiece " + impl_->model_type + " model";
}

int32_t SentencePieceTokenizer::bos_id() const { return impl_->processor.bos_id(); }

int32_t SentencePieceTokenizer::eos_id() const { return impl_->processor.eos_id(); }

}  // namespace ztrain::data
