#include "data/byte_tokenizer.h"

#include <algorithm>
#include <cstdio>

namespace ztrain::data {
namespace {

// Checks the UTF-8 sequence starting at text[i]. Returns its length, or 0 and sets *bad to
// the offset of the first byte that cannot belong to it (the lead byte when the text ends
// inside the sequence).
size_t Utf8SequenceLength(std::string_view text, size_t i, size_t* bad) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return 1;
  *bad = i;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // UTF-16 surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;  // a stray continuation byte, an overlong lead C0/C1, or F5..FF
  }
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= text.size()) {
      *bad = i;
      return 0;
    }
    *bad = i + k;
    const unsigned char b = byte(i + k);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
  }
  return len;
}

}  // namespace

int64_t FindInvalidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    size_t bad = 0;
    const size_t len = Utf8SequenceLength(text, i, &bad);
    if (len == 0) return static_cast<int64_t>(bad);
    i += len;
  }
  return -1;
}

int64_t ReplaceInvalidUtf8(std::string_view text, std::string* out, int64_t* first) {
  int64_t replaced = 0;
  size_t i = 0, copied = 0;  // text[copied, i) is valid and not yet in *out
  while (i < text.size()) {
    size_t bad = 0;
    const size_t len = Utf8SequenceLength(text, i, &bad);
    if (len > 0) {
      i += len;
      continue;
    }
    if (replaced++ == 0) {
      out->clear();
      *first = static_cast<int64_t>(i);
    }
    out->append(text.substr(copied, i - copied));
    out->append("\xEF\xBF\xBD");
    // The maximal subpart: up to the byte that cannot continue it, the whole rest when the
    // text ends inside a sequence (bad == i for a valid lead byte), else the lone byte.
    const auto lead = static_cast<unsigned char>(text[i]);
    const bool valid_lead = lead >= 0xC2 && lead <= 0xF4;
    i = bad > i ? bad : valid_lead ? text.size() : i + 1;
    copied = i;
  }
  if (replaced > 0) out->append(text.substr(copied));
  return replaced;
}

std::vector<uint16_t> EncodeBytes(std::string_view text) {
  std::vector<uint16_t> tokens(text.size());
  std::transform(text.begin(), text.end(), tokens.begin(),
                 [](char c) { return static_cast<uint16_t>(static_cast<unsigned char>(c)); });
  return tokens;
}

std::string SplitShardPath(const std::string& shard_path, int64_t index) {
  std::string stem = shard_path;
  if (stem.size() >= 4 && stem.compare(stem.size() - 4, 4, ".bin") == 0)
    stem.resize(stem.size() - 4);
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "_%06lld.bin", static_cast<long long>(index));
  return stem + suffix;
}

std::string Decode(std::span<const int32_t> tokens) {
  std::string out;
  out.reserve(tokens.size());
  for (int32_t t : tokens) {
    if (t >= 0 && t < 256) {
      out.push_back(static_cast<char>(t));
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
    }
  }
  return out;
}

}  // namespace ztrain::data
