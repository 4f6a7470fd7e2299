#include "data/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/json_text.h"
#include "data/byte_tokenizer.h"
#include "data/hf_metaspace.h"

namespace ztrain::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::ztrain::detail::StrCat;

// tokenizers' ByteLevel pattern (GPT-2's), used when ByteLevel has use_regex true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string Utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xf0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

// The code points of valid UTF-8 `s`.
std::vector<uint32_t> CodePoints(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

// GPT-2's bytes_to_unicode: every byte as a printable code point (the printable Latin-1 bytes
// as themselves, the others from U+0100 on, in byte order).
std::vector<uint32_t> ByteCodePoints() {
  std::vector<uint32_t> cp(256, 0);
  std::vector<bool> printable(256, false);
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xa1; b <= 0xac; ++b) printable[b] = true;
  for (int b = 0xae; b <= 0xff; ++b) printable[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) cp[b] = printable[b] ? static_cast<uint32_t>(b) : next++;
  return cp;
}

// A compiled PCRE2 pattern with Unicode properties, JIT-compiled where PCRE2 has a JIT.
class Regex {
 public:
  explicit Regex(const std::string& pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      throw ConfigError(StrCat("tokenizer: the pre-tokenizer's regex '", pattern,
                               "' does not compile at offset ", offset, ": ",
                               reinterpret_cast<const char*>(message)));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // interpreted where there is no JIT
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // [begin, end) of every match in `s`, left to right (an empty match advances one code
  // point and is not reported).
  std::vector<std::pair<size_t, size_t>> Matches(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t at = 0;
    while (at <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] == ov[0]) {  // empty: step over one code point
        at = ov[0] + 1;
        while (at < s.size() && (static_cast<unsigned char>(s[at]) & 0xc0) == 0x80) ++at;
        continue;
      }
      out.emplace_back(ov[0], ov[1]);
      at = ov[1];
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
};

// BPE results of pre-tokens, per thread (HfTokenizer::Encode).
struct WordCache {
  uint64_t owner = 0;  // Impl::instance
  std::unordered_map<std::string, std::vector<int32_t>> map;
};

std::atomic<uint64_t> next_instance{1};

json ReadTokenizerJson(const std::string& path) {
  fs::path file = path;
  std::error_code ec;
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  std::ifstream in(file);
  ZTRAIN_CHECK_T(IoError, in.good(), "tokenizer: cannot open ", file.string(),
                 fs::is_directory(path, ec)
                     ? " (the directory holds no tokenizer.json or tokenizer.model)"
                     : "");
  in.close();
  const json j = ParseJsonOrThrow<IoError>(ReadTextFile(file.string(), "tokenizer"),
                                           "tokenizer " + file.string());
  ZTRAIN_CHECK_T(IoError, j.is_object(), "tokenizer ", file.string(),
                 " is JSON but not a tokenizer.json object (it holds a ", j.type_name(), ")");
  return j;
}

std::string TypeOf(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : "";
}

}  // namespace

struct HfTokenizer::Impl {
  // One step of pre-tokenization, in order.
  struct Step {
    std::unique_ptr<Regex> split;  // Split (Isolated) or ByteLevel's regex
    bool byte_level = false;       // map to byte code points here (ByteLevel)
    bool add_prefix_space = false;
  };
  struct AddedToken {
    std::string content;
    int32_t id;
  };

  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;  // vocabulary entries and added tokens
  std::vector<bool> is_added;
  detail::MergeMap merges;
  std::unique_ptr<detail::MetaspaceBpe> metaspace;  // byte_fallback BPE (else byte-level)
  std::vector<Step> steps;
  std::vector<AddedToken> added;  // longest first
  std::array<bool, 256> added_starts{};  // the first bytes of the added tokens
  std::vector<int32_t> byte_ids;  // the vocabulary id of each byte's code point
  std::unordered_map<uint32_t, uint8_t> code_point_byte;
  std::vector<std::string> byte_strings;  // each byte as its code point's UTF-8
  std::vector<int32_t> template_before, template_after;  // the post_processor's specials
  uint64_t instance = next_instance++;  // names this tokenizer's words in a WordCache
  bool ignore_merges = false;  // a word in the vocabulary is its token (Llama-3, tiktoken)

  static uint64_t PairKey(int32_t a, int32_t b) { return detail::MergeKey(a, b); }

  void ReadModel(const json& m) {
    ZTRAIN_CHECK_T(ConfigError, TypeOf(m) == "BPE", "tokenizer: model.type is '", TypeOf(m),
                   "'; ztrain reads BPE models (byte-level: GPT-2, Llama-3, Qwen2; with "
                   "byte_fallback: Llama-2, Mistral)");
    for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
      const bool unset = !m.contains(key) || m[key].is_null() || m[key] == "";
      ZTRAIN_CHECK_T(ConfigError, unset, "tokenizer: model.", key, " is ",
                     m.contains(key) ? m[key].dump() : "", "; ztrain reads BPE without it");
    }
    ignore_merges = m.value("ignore_merges", false);
    ZTRAIN_CHECK_T(ConfigError,
                   m.contains("vocab") && m["vocab"].is_object() && !m["vocab"].empty(),
                   "tokenizer: model.vocab is ",
                   m.contains("vocab") ? m["vocab"].dump().substr(0, 40) : "missing",
                   "; a BPE tokenizer.json maps each token to its id there: is this the model's "
                   "tokenizer.json, whole?");
    ZTRAIN_CHECK_T(ConfigError, m.contains("merges") && m["merges"].is_array(),
                   "tokenizer: model.merges is missing or not a list; a BPE tokenizer.json lists "
                   "its merges there");
    for (const auto& [token, id] : m.at("vocab").items()) {
      ZTRAIN_CHECK_T(ConfigError,
                     id.is_number_integer() && id.get<int64_t>() >= 0 &&
                         id.get<int64_t>() < (int64_t{1} << 31),
                     "tokenizer: model.vocab gives token '", token, "' the id ", id.dump(),
                     "; ids are whole numbers from 0");
      const int32_t i = id.get<int32_t>();
      vocab.emplace(token, i);
      if (static_cast<size_t>(i) >= id_to_token.size()) id_to_token.resize(i + 1);
      ZTRAIN_CHECK_T(ConfigError, id_to_token[i].empty() || id_to_token[i] == token,
                     "tokenizer: model.vocab gives the id ", i, " to two tokens, '", id_to_token[i],
                     "' and '", token, "': each id names one token");
      id_to_token[i] = token;
    }
    is_added.assign(id_to_token.size(), false);
    int32_t rank = 0;
    for (const json& merge : m.at("merges")) {
      std::string a, b;
      if (merge.is_string()) {
        const std::string s = merge.get<std::string>();
        const size_t space = s.find(' ');
        ZTRAIN_CHECK_T(ConfigError, space != std::string::npos, "tokenizer: merge '", s,
                       "' is not two tokens separated by a space");
        a = s.substr(0, space);
        b = s.substr(space + 1);
      } else {
        a = merge.at(0).get<std::string>();
        b = merge.at(1).get<std::string>();
      }
      const auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
      ZTRAIN_CHECK_T(ConfigError, ia != vocab.end() && ib != vocab.end() && iab != vocab.end(),
                     "tokenizer: merge '", a, " ", b, "' (rank ", rank,
                     ") names a token the vocabulary does not hold");
      merges.emplace(PairKey(ia->second, ib->second), std::make_pair(rank, iab->second));
      ++rank;
    }
  }

  void ReadPreTokenizer(const json& p) {
    const std::string type = TypeOf(p);
    if (type == "Sequence") {
      for (const json& q : p.at("pretokenizers")) ReadPreTokenizer(q);
      return;
    }
    Step step;
    if (type == "ByteLevel") {
      step.byte_level = true;
      step.add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) step.split = std::make_unique<Regex>(kGpt2Pattern);
    } else if (type == "Split") {
      const json& pattern = p.at("pattern");
      ZTRAIN_CHECK_T(ConfigError, pattern.contains("Regex"),
                     "tokenizer: a Split pre-tokenizer with pattern ", pattern.dump(),
                     "; ztrain reads Regex patterns");
      const std::string behavior = p.value("behavior", "");
      ZTRAIN_CHECK_T(ConfigError, behavior == "Isolated" && !p.value("invert", false),
                     "tokenizer: a Split pre-tokenizer with behavior '", behavior,
                     "' and invert ", p.value("invert", false),
                     "; ztrain reads behavior \"Isolated\" without invert");
      step.split = std::make_unique<Regex>(pattern["Regex"].get<std::string>());
    } else {
      throw ConfigError(StrCat("tokenizer: pre_tokenizer type '", type,
                               "'; ztrain reads ByteLevel, Split and Sequence of them"));
    }
    steps.push_back(std::move(step));
  }

  void ReadAddedTokens(const json& tokens) {
    for (const json& t : tokens) {
      for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
        ZTRAIN_CHECK_T(ConfigError, !t.value(flag, false), "tokenizer: added token ",
                       t.at("content").dump(), " has ", flag,
                       " true; ztrain matches added tokens as they are");
      }
      ZTRAIN_CHECK_T(ConfigError, !metaspace || !t.value("normalized", false),
                     "tokenizer: added token ", t.at("content").dump(), " has normalized true "
                     "with model.byte_fallback; ztrain matches added tokens before normalizing");
      const auto id = t.at("id").get<int32_t>();
      const std::string content = t.at("content").get<std::string>();
      added.push_back({content, id});
      if (static_cast<size_t>(id) >= id_to_token.size()) {
        id_to_token.resize(id + 1);
        is_added.resize(id + 1, false);
      }
      id_to_token[id] = content;
      is_added[id] = true;
    }
    std::stable_sort(added.begin(), added.end(), [](const AddedToken& a, const AddedToken& b) {
      return a.content.size() > b.content.size();
    });
    for (const AddedToken& t : added) {
      if (!t.content.empty()) added_starts[static_cast<unsigned char>(t.content[0])] = true;
    }
  }

  // added_tokens and post_processor, after the model and the pre-tokenization.
  void ReadTheRest(const json& j) {
    if (j.contains("added_tokens")) ReadAddedTokens(j["added_tokens"]);
    if (j.contains("post_processor") && !j["post_processor"].is_null()) {
      ReadPostProcessor(j["post_processor"]);
    }
  }

  // TemplateProcessing's "single" template: special tokens around "$A" (the text).
  void ReadPostProcessor(const json& p) {
    const std::string type = TypeOf(p);
    if (type == "Sequence") {
      for (const json& q : p.at("processors")) ReadPostProcessor(q);
      return;
    }
    if (type != "TemplateProcessing") return;  // ByteLevel, RobertaProcessing...: no specials
    bool seen_text = false;
    for (const json& piece : p.at("single")) {
      if (piece.contains("Sequence")) {
        seen_text = true;
        continue;
      }
      const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
      const json& ids = p.at("special_tokens").at(name).at("ids");
      std::vector<int32_t>& to = seen_text ? template_after : template_before;
      for (const json& id : ids) to.push_back(id.get<int32_t>());
    }
  }

  void SetUpBytes() {
    const std::vector<uint32_t> cps = ByteCodePoints();
    byte_ids.resize(256);
    byte_strings.resize(256);
    for (int b = 0; b < 256; ++b) {
      byte_strings[b] = Utf8(cps[b]);
      code_point_byte[cps[b]] = static_cast<uint8_t>(b);
      const auto it = vocab.find(byte_strings[b]);
      ZTRAIN_CHECK_T(ConfigError, it != vocab.end(), "tokenizer: byte 0x", std::hex, b,
                     " (", byte_strings[b], ") has no token; a byte-level BPE vocabulary holds "
                     "all 256");
      byte_ids[b] = it->second;
    }
  }

  // BPE over one pre-token's bytes.
  void EncodeWord(std::string_view word, std::vector<int32_t>& out) const {
    if (ignore_merges) {
      std::string symbols;
      for (const char c : word) symbols += byte_strings[static_cast<unsigned char>(c)];
      if (const auto it = vocab.find(symbols); it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<int32_t> symbols;
    symbols.reserve(word.size());
    for (const char c : word) symbols.push_back(byte_ids[static_cast<unsigned char>(c)]);
    while (symbols.size() > 1) {
      int32_t best_rank = std::numeric_limits<int32_t>::max(), merged = -1;
      size_t at = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        const auto it = merges.find(PairKey(symbols[i], symbols[i + 1]));
        if (it != merges.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          merged = it->second.second;
          at = i;
        }
      }
      if (merged < 0) break;
      // Merge every occurrence of the best pair, left to right.
      const int32_t a = symbols[at], b = symbols[at + 1];
      std::vector<int32_t> next;
      next.reserve(symbols.size());
      for (size_t i = 0; i < symbols.size();) {
        if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
          next.push_back(merged);
          i += 2;
        } else {
          next.push_back(symbols[i++]);
        }
      }
      symbols.swap(next);
    }
    out.insert(out.end(), symbols.begin(), symbols.end());
  }

  // Normalizes a segment between added tokens (`at_start`: it starts the text) and encodes
  // its words (byte_fallback BPE).
  void EncodeMetaspaceSegment(std::string_view segment, bool at_start, std::vector<int32_t>& out,
                              std::unordered_map<std::string, std::vector<int32_t>>& cache) const {
    constexpr size_t kMaxCachedWordBytes = 256;  // a text without spaces may be one word
    const std::string normalized = metaspace->Normalize(segment, at_start);
    for (const std::string_view word : metaspace->Words(normalized)) {
      if (word.size() > kMaxCachedWordBytes) {
        metaspace->EncodeWord(word, merges, out);
        continue;
      }
      auto it = cache.find(std::string(word));
      if (it == cache.end()) {
        std::vector<int32_t> ids;
        metaspace->EncodeWord(word, merges, ids);
        it = cache.emplace(std::string(word), std::move(ids)).first;
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
  }

  // Pre-tokenizes a segment between added tokens and encodes its pieces.
  void EncodeSegment(std::string_view segment, bool at_start, std::vector<int32_t>& out,
                     std::unordered_map<std::string, std::vector<int32_t>>& cache) const {
    if (metaspace) return EncodeMetaspaceSegment(segment, at_start, out, cache);
    std::string text(segment);
    std::vector<std::string> pieces{text};
    for (const Step& step : steps) {
      std::vector<std::string> next;
      for (std::string& piece : pieces) {
        if (step.add_prefix_space && !piece.empty() && piece[0] != ' ') piece = " " + piece;
        if (!step.split) {
          next.push_back(std::move(piece));
          continue;
        }
        size_t last = 0;
        for (const auto& [b, e] : step.split->Matches(piece)) {
          if (b > last) next.push_back(piece.substr(last, b - last));
          next.push_back(piece.substr(b, e - b));
          last = e;
        }
        if (last < piece.size()) next.push_back(piece.substr(last));
      }
      pieces.swap(next);
    }
    for (const std::string& piece : pieces) {
      if (piece.empty()) continue;
      auto it = cache.find(piece);
      if (it == cache.end()) {
        std::vector<int32_t> ids;
        EncodeWord(piece, ids);
        it = cache.emplace(piece, std::move(ids)).first;
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
  }
};

HfTokenizer::HfTokenizer(const std::string& path) : impl_(std::make_unique<Impl>()) {
  const json j = ReadTokenizerJson(path);
  try {
    const json& normalizer = j.contains("normalizer") ? j["normalizer"] : json();
    const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
    impl_->ReadModel(j.at("model"));
    if (j["model"].value("byte_fallback", false)) {
      impl_->metaspace = std::make_unique<detail::MetaspaceBpe>(normalizer, pre, impl_->vocab);
      ZTRAIN_CHECK_T(ConfigError, !impl_->ignore_merges, "tokenizer: model.ignore_merges with "
                     "byte_fallback; ztrain reads ignore_merges in byte-level BPE");
      impl_->ReadTheRest(j);
      return;
    }
    ZTRAIN_CHECK_T(ConfigError, normalizer.is_null() || TypeOf(normalizer) == "NFC",
                   "tokenizer: normalizer '", TypeOf(normalizer),
                   "'; ztrain reads files without a normalizer (or NFC), and Prepend/Replace "
                   "with model.byte_fallback (Llama-2)");
    ZTRAIN_CHECK_T(ConfigError, !pre.is_null(),
                   "tokenizer: no pre_tokenizer; ztrain reads byte-level BPE, whose "
                   "pre_tokenizer is ByteLevel");
    impl_->ReadPreTokenizer(pre);
    const bool byte_level = std::any_of(impl_->steps.begin(), impl_->steps.end(),
                                        [](const Impl::Step& s) { return s.byte_level; });
    ZTRAIN_CHECK_T(ConfigError, byte_level,
                   "tokenizer: the pre_tokenizer has no ByteLevel step; ztrain reads "
                   "byte-level BPE, and Metaspace with model.byte_fallback");
    impl_->SetUpBytes();
    impl_->ReadTheRest(j);
  } catch (const json::exception& e) {
    throw ConfigError(StrCat("tokenizer: ", path, " is not a tokenizer.json ztrain reads: ",
                             e.what()));
  }
}

HfTokenizer::~HfTokenizer() = default;
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;

std::vector<int32_t> HfTokenizer::Encode(std::string_view text) const {
  const int64_t bad = FindInvalidUtf8(text);
  ZTRAIN_CHECK(bad < 0, "tokenizer: the text is not valid UTF-8 at byte ", bad);
  std::vector<int32_t> out;
  // Words repeat across documents: each thread keeps their ids for the last tokenizer it
  // used (by instance number, never by address, which a new tokenizer may reuse), bounded.
  constexpr size_t kMaxCachedWords = size_t{1} << 18;  // ~40 MB at most
  thread_local WordCache words;
  if (words.owner != impl_->instance || words.map.size() > kMaxCachedWords) {
    words.map.clear();
    words.owner = impl_->instance;
  }
  auto& cache = words.map;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    // Only a position whose byte starts an added token is compared against them (Llama-3
    // has 256; text rarely holds their first byte, '<').
    if (!impl_->added_starts[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const Impl::AddedToken* hit = nullptr;
    for (const Impl::AddedToken& t : impl_->added) {
      if (text.compare(i, t.content.size(), t.content) == 0) {
        hit = &t;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > start) impl_->EncodeSegment(text.substr(start, i - start), start == 0, out, cache);
    out.push_back(hit->id);
    i += hit->content.size();
    start = i;
  }
  if (start < text.size()) impl_->EncodeSegment(text.substr(start), start == 0, out, cache);
  return out;
}

std::string HfTokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  bool strip = impl_->metaspace && impl_->metaspace->strips_at_start();
  for (const int32_t id : ids) {
    ZTRAIN_CHECK(id >= 0 && static_cast<size_t>(id) < impl_->id_to_token.size(),
                 "tokenizer: id ", id, " is outside the vocabulary of ", vocab_size());
    const std::string& token = impl_->id_to_token[id];
    if (impl_->is_added[id]) {
      out += token;
      strip = impl_->metaspace && impl_->metaspace->strips_after_added();
      continue;
    }
    if (impl_->metaspace) {
      impl_->metaspace->AppendText(id, token, strip, out);
      strip = false;
      continue;
    }
    for (const uint32_t cp : CodePoints(token)) {
      const auto it = impl_->code_point_byte.find(cp);
      ZTRAIN_CHECK(it != impl_->code_point_byte.end(), "tokenizer: token ", id, " ('", token,
                   "') holds U+", std::hex, cp, ", which is no byte's code point");
      out += static_cast<char>(it->second);
    }
  }
  return out;
}

std::string HfTokenizer::kind() const {
  if (!impl_->metaspace) return "tokenizer.json byte-level BPE";
  return "tokenizer.json BPE with byte fallback (" + impl_->metaspace->form() + ")";
}

int64_t HfTokenizer::vocab_size() const {
  return static_cast<int64_t>(impl_->id_to_token.size());
}

const std::vector<int32_t>& HfTokenizer::template_before() const {
  return impl_->template_before;
}

const std::vector<int32_t>& HfTokenizer::template_after() const {
  return impl_->template_after;
}

int32_t HfTokenizer::TokenId(std::string_view token) const {
  const auto it = impl_->vocab.find(std::string(token));
  if (it != impl_->vocab.end()) return it->second;
  for (const Impl::AddedToken& t : impl_->added) {
    if (t.content == token) return t.id;
  }
  return -1;
}

}  // namespace ztrain::data
