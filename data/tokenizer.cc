#include "data/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_text.h"
#include "data/byte_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"

namespace ztrain::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::ztrain::detail::StrCat;

// tokenizer_config.json beside the tokenizer (null when there is none).
json ReadTokenizerConfig(const std::string& path) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  const fs::path file = dir / "tokenizer_config.json";
  if (!std::ifstream(file).good()) return json();
  const json j = ParseJsonOrThrow<IoError>(ReadTextFile(file.string(), "tokenizer config"),
                                           "tokenizer config " + file.string());
  ZTRAIN_CHECK_T(IoError, j.is_object(), "tokenizer config ", file.string(),
                 " is JSON but not an object (it holds a ", j.type_name(), ")");
  return j;
}

// A token named in tokenizer_config.json: "<s>", {"content": "<s>", ...} or null ("").
std::string ConfigToken(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return "";
  const json& t = config[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content")) return t["content"].get<std::string>();
  return "";
}

int32_t RequireToken(const Tokenizer& tokenizer, const std::string& token, const char* what) {
  const int32_t id = tokenizer.TokenId(token);
  ZTRAIN_CHECK_T(ConfigError, id >= 0, "tokenizer: ", what, " '", token,
                 "' is not a token of this tokenizer");
  return id;
}

// Rule 1 of Note [Document tokens]: add_bos_token / add_eos_token; false when the config
// says neither.
bool FromConfigFlags(const json& config, const Tokenizer& tokenizer, DocumentTokens& d) {
  const bool has_bos = config.is_object() && config.contains("add_bos_token");
  const bool has_eos = config.is_object() && config.contains("add_eos_token");
  if (!has_bos && !has_eos) return false;
  if (has_bos && config["add_bos_token"].get<bool>()) {
    d.before.push_back(RequireToken(tokenizer, ConfigToken(config, "bos_token"),
                                    "tokenizer_config.json bos_token"));
  }
  if (has_eos && config["add_eos_token"].get<bool>()) {
    d.after.push_back(RequireToken(tokenizer, ConfigToken(config, "eos_token"),
                                   "tokenizer_config.json eos_token"));
  }
  d.source = "tokenizer_config.json add_bos_token/add_eos_token";
  return true;
}

DocumentTokens DocumentTokenRule(const std::string& path, const Tokenizer& tokenizer,
                                 const std::string& bos, const std::string& eos) {
  DocumentTokens d;
  if (bos != "auto" || eos != "auto") {
    ZTRAIN_CHECK_T(ConfigError, !path.empty(),
                   "--bos and --eos name special tokens, and byte tokens have none; give "
                   "--tokenizer");
    if (bos != "auto" && bos != "none") d.before.push_back(RequireToken(tokenizer, bos, "--bos"));
    if (eos != "auto" && eos != "none") d.after.push_back(RequireToken(tokenizer, eos, "--eos"));
    d.source = "--bos/--eos";
    return d;
  }
  if (path.empty()) {
    d.source = "byte tokens have no special tokens";
    return d;
  }
  const json config = ReadTokenizerConfig(path);
  if (FromConfigFlags(config, tokenizer, d)) return d;
  if (const auto* hf = dynamic_cast<const HfTokenizer*>(&tokenizer)) {
    d.before = hf->template_before();
    d.after = hf->template_after();
    d.source = "tokenizer.json post_processor";
    if (!d.before.empty() || !d.after.empty()) return d;
  }
  const auto* sp = dynamic_cast<const SentencePieceTokenizer*>(&tokenizer);
  if (sp != nullptr && sp->bos_id() >= 0) {
    d.before.push_back(sp->bos_id());
    d.source = "the SentencePiece model's BOS, as LlamaTokenizer adds by default";
    return d;
  }
  std::string separator = ConfigToken(config, "eos_token");
  if (separator.empty() && sp != nullptr && sp->eos_id() >= 0) {
    separator = sp->Decode(std::vector<int32_t>{sp->eos_id()});
  }
  if (separator.empty()) separator = "<|endoftext|>";
  const int32_t id = tokenizer.TokenId(separator);
  if (id >= 0) {
    d.before.push_back(id);
    d.source = StrCat("llm.c's rule: ", separator, " before each document");
  } else {
    d.source = "none: the tokenizer adds no special tokens and has no end-of-text token";
  }
  return d;
}

}  // namespace

std::vector<int32_t> ByteTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::Decode(std::span<const int32_t> ids) const {
  return data::Decode(ids);
}

int32_t ByteTokenizer::TokenId(std::string_view token) const {
  return token.size() == 1 ? static_cast<unsigned char>(token[0]) : -1;
}

std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& path) {
  if (path.empty()) return std::make_unique<ByteTokenizer>();
  const std::string file = TokenizerFile(path);
  if (fs::path(file).extension() == ".model") {
    return std::make_unique<SentencePieceTokenizer>(file);
  }
  return std::make_unique<HfTokenizer>(path);
}

std::string TokenizerFile(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  const fs::path json_file = fs::path(path) / "tokenizer.json";
  const fs::path model_file = fs::path(path) / "tokenizer.model";
  if (!fs::exists(json_file, ec) && fs::exists(model_file, ec)) return model_file.string();
  return json_file.string();
}

DocumentTokens ReadDocumentTokens(const std::string& path, const Tokenizer& tokenizer,
                                  const std::string& bos, const std::string& eos) {
  DocumentTokens d = DocumentTokenRule(path, tokenizer, bos, eos);
  d.layout = "text";
  if (!d.before.empty()) d.layout = tokenizer.Decode(d.before) + " + " + d.layout;
  if (!d.after.empty()) d.layout += " + " + tokenizer.Decode(d.after);
  return d;
}

}  // namespace ztrain::data
