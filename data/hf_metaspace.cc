#include "data/hf_metaspace.h"

#include <cstdio>
#include <queue>

#include "core/error.h"

namespace ztrain::data::detail {
namespace {

using nlohmann::json;
using ::ztrain::detail::StrCat;

constexpr std::string_view kMeta = "\xE2\x96\x81";  // "▁", U+2581

std::string TypeOf(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : "";
}

// The length of the UTF-8 sequence that starts with `lead` (valid UTF-8).
size_t SequenceLength(char lead) {
  const auto c = static_cast<unsigned char>(lead);
  return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

uint32_t CodePoint(std::string_view s) {
  const auto c = static_cast<unsigned char>(s[0]);
  const size_t n = s.size();
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[k]) & 0x3f);
  return cp;
}

// Whether some entry holds a "▁" right after another character (then a merge may cross the
// start of a "▁" run, and a text between added tokens is one word).
bool MergesMayCrossSpaces(const std::unordered_map<std::string, int32_t>& vocab) {
  for (const auto& [token, id] : vocab) {
    for (size_t at = token.find(kMeta, 1); at != std::string::npos;
         at = token.find(kMeta, at + 1)) {
      if (at < kMeta.size() || token.compare(at - kMeta.size(), kMeta.size(), kMeta) != 0) {
        return true;
      }
    }
  }
  return false;
}

// A symbol of a word during BPE: a token id, linked to its neighbours (-1: none). A symbol
// merged into its left neighbour has id -1.
struct Symbol {
  int32_t id;
  int32_t prev, next;
};

// A merge that applies to adjacent symbols `left` and `right` if both still hold the ids it
// was found for; lower rank first, then leftmost (as the `tokenizers` library and
// SentencePiece order them).
struct Candidate {
  int32_t rank, left, right, left_id, right_id, merged;
  bool operator>(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};

}  // namespace

MetaspaceBpe::MetaspaceBpe(const json& normalizer, const json& pre_tokenizer,
                           const std::unordered_map<std::string, int32_t>& vocab) {
  if (!normalizer.is_null()) {
    ZTRAIN_CHECK_T(ConfigError, pre_tokenizer.is_null(),
                   "tokenizer: model.byte_fallback is true with a normalizer and the "
                   "pre_tokenizer '",
                   TypeOf(pre_tokenizer),
                   "'; ztrain reads byte_fallback BPE with a Prepend/Replace normalizer and no "
                   "pre_tokenizer (Llama-2), or a Metaspace pre_tokenizer and no normalizer");
    ReadNormalizer(normalizer);
  } else {
    ReadMetaspace(pre_tokenizer);
  }
  split_safe_ = !MergesMayCrossSpaces(vocab);
  byte_ids_.resize(256);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const auto it = vocab.find(name);
    ZTRAIN_CHECK_T(ConfigError, it != vocab.end(),
                   "tokenizer: model.byte_fallback is true but the vocabulary has no token ", name,
                   "; byte fallback needs all 256");
    byte_ids_[b] = it->second;
    id_bytes_[it->second] = static_cast<uint8_t>(b);
  }
  for (const auto& [token, id] : vocab) {
    if (!token.empty() && SequenceLength(token[0]) == token.size()) {
      char_ids_[CodePoint(token)] = id;
    }
  }
}

void MetaspaceBpe::ReadNormalizer(const json& normalizer) {
  std::vector<json> steps{normalizer};
  if (TypeOf(normalizer) == "Sequence") {
    steps = normalizer.at("normalizers").get<std::vector<json>>();
  }
  bool prepend = false, replace = false;
  for (const json& n : steps) {
    const std::string type = TypeOf(n);
    if (type == "Prepend" && n.value("prepend", "") == kMeta) {
      prepend = true;
    } else if (type == "Replace" && n.value("pattern", json()) == json{{"String", " "}} &&
               n.value("content", "") == kMeta) {
      replace = true;
    } else {
      throw ConfigError(StrCat("tokenizer: normalizer '", type, "' (", n.dump(),
                               ") with model.byte_fallback; ztrain reads Prepend(\"▁\") and "
                               "Replace(\" \" -> \"▁\") there, as Llama-2's file has"));
    }
  }
  ZTRAIN_CHECK_T(ConfigError, replace,
                 "tokenizer: model.byte_fallback is true and the normalizer does not replace "
                 "\" \" by \"▁\"; ztrain reads Llama-2's normalizer, Sequence[Prepend(\"▁\"), "
                 "Replace(\" \" -> \"▁\")]");
  prefix_ = prepend ? Prefix::kEachText : Prefix::kNone;
  form_ = prepend ? "Prepend/Replace normalizer" : "Replace normalizer";
}

void MetaspaceBpe::ReadMetaspace(const json& p) {
  ZTRAIN_CHECK_T(ConfigError, TypeOf(p) == "Metaspace",
                 "tokenizer: model.byte_fallback is true and the pre_tokenizer is '", TypeOf(p),
                 "'; ztrain reads byte_fallback BPE with a Prepend/Replace normalizer (Llama-2) "
                 "or a Metaspace pre_tokenizer (Mistral)");
  ZTRAIN_CHECK_T(ConfigError, p.value("replacement", std::string(kMeta)) == kMeta,
                 "tokenizer: Metaspace replacement '", p.value("replacement", ""),
                 "'; ztrain reads \"▁\"");
  std::string scheme;
  if (p.contains("prepend_scheme")) {
    scheme = p["prepend_scheme"].get<std::string>();
  } else {  // files written before tokenizers 0.14
    scheme = p.value("add_prefix_space", true) ? "always" : "never";
  }
  if (scheme == "always") {
    prefix_ = Prefix::kEachUnlessSet;
  } else if (scheme == "first") {
    prefix_ = Prefix::kFirstUnlessSet;
  } else {
    ZTRAIN_CHECK_T(ConfigError, scheme == "never", "tokenizer: Metaspace prepend_scheme '", scheme,
                   "'; ztrain reads always, first and never");
    prefix_ = Prefix::kNone;
  }
  split_at_each_ = p.value("split", true);
  form_ = StrCat("Metaspace (prepend_scheme ", scheme, ", split ",
                 split_at_each_ ? "true" : "false", ")");
}

std::string MetaspaceBpe::Normalize(std::string_view text, bool at_start) const {
  std::string out;
  if (text.empty()) return out;
  out.reserve(text.size() + text.size() / 2 + kMeta.size());
  for (const char c : text) {
    if (c == ' ') {
      out += kMeta;
    } else {
      out += c;
    }
  }
  const bool set = out.starts_with(kMeta);
  const bool prepend = prefix_ == Prefix::kEachText ||
                       (prefix_ == Prefix::kEachUnlessSet && !set) ||
                       (prefix_ == Prefix::kFirstUnlessSet && !set && at_start);
  if (prepend) out.insert(0, kMeta);
  return out;
}

std::vector<std::string_view> MetaspaceBpe::Words(std::string_view normalized) const {
  if (!split_at_each_ && !split_safe_) return {normalized};
  std::vector<std::string_view> words;
  size_t begin = 0;
  for (size_t at = normalized.find(kMeta, 1); at != std::string_view::npos;
       at = normalized.find(kMeta, at + 1)) {
    const bool after_meta =
        at >= kMeta.size() && normalized.compare(at - kMeta.size(), kMeta.size(), kMeta) == 0;
    if (split_at_each_ || !after_meta) {
      words.push_back(normalized.substr(begin, at - begin));
      begin = at;
    }
  }
  words.push_back(normalized.substr(begin));
  return words;
}

void MetaspaceBpe::EncodeWord(std::string_view word, const MergeMap& merges,
                              std::vector<int32_t>& out) const {
  std::vector<Symbol> symbols;
  for (size_t i = 0; i < word.size();) {
    const size_t n = SequenceLength(word[i]);
    const auto it = char_ids_.find(CodePoint(word.substr(i, n)));
    if (it != char_ids_.end()) {
      symbols.push_back({it->second, 0, 0});
    } else {
      for (size_t k = 0; k < n; ++k) {
        symbols.push_back({byte_ids_[static_cast<unsigned char>(word[i + k])], 0, 0});
      }
    }
    i += n;
  }
  const auto count = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i < count; ++i) {
    symbols[i].prev = i - 1;
    symbols[i].next = i + 1 < count ? i + 1 : -1;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const auto it = merges.find(MergeKey(symbols[left].id, symbols[right].id));
    if (it == merges.end()) return;
    queue.push(
        {it->second.first, left, right, symbols[left].id, symbols[right].id, it->second.second});
  };
  for (int32_t i = 0; i + 1 < count; ++i) consider(i, i + 1);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.left];
    if (left.id != c.left_id || left.next != c.right || symbols[c.right].id != c.right_id) {
      continue;  // one of them was merged since
    }
    left.id = c.merged;
    left.next = symbols[c.right].next;
    if (left.next >= 0) symbols[left.next].prev = c.left;
    symbols[c.right].id = -1;
    consider(left.prev, c.left);
    consider(c.left, left.next);
  }
  for (int32_t i = count > 0 ? 0 : -1; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

void MetaspaceBpe::AppendText(int32_t id, std::string_view token, bool strip,
                              std::string& out) const {
  if (const auto it = id_bytes_.find(id); it != id_bytes_.end()) {
    out += static_cast<char>(it->second);
    return;
  }
  if (strip && token.starts_with(kMeta)) token.remove_prefix(kMeta.size());
  for (size_t at = 0; at < token.size();) {
    if (token.compare(at, kMeta.size(), kMeta) == 0) {
      out += ' ';
      at += kMeta.size();
    } else {
      out += token[at++];
    }
  }
}

}  // namespace ztrain::data::detail
