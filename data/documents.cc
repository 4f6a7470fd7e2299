#include "data/documents.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/loss_target.h"
#include "data/token_shard.h"

namespace ztrain::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kKeys = "data.document_start_token or data.document_end_token";

// The boundary one manifest gives: its tokenizer's first token before each document, else its
// last after each; nothing (both -1) for a corpus without document tokens (byte tokens).
DocumentBoundary FromManifest(const std::string& path) {
  std::ifstream in(path);
  json m;
  try {
    m = json::parse(in);
  } catch (const json::exception& e) {
    throw ConfigError(detail::StrCat("data.packed_documents: cannot read the corpus manifest '",
                                     path, "': ", e.what()));
  }
  const json* tokens = nullptr;
  if (m.contains("tokenizer") && m["tokenizer"].contains("document_tokens")) {
    tokens = &m["tokenizer"]["document_tokens"];
  }
  DocumentBoundary b;
  b.source = "the corpus manifest " + path;
  if (tokens == nullptr) return b;
  const json& before = (*tokens)["before"];
  const json& after = (*tokens)["after"];
  if (before.is_array() && !before.empty()) {
    b.start_token = before.front().get<int32_t>();
  } else if (after.is_array() && !after.empty()) {
    b.end_token = after.back().get<int32_t>();
  }
  return b;
}

bool SameTokens(const DocumentBoundary& a, const DocumentBoundary& b) {
  return a.start_token == b.start_token && a.end_token == b.end_token;
}

std::string Describe(const DocumentBoundary& b) {
  return b.start_token >= 0 ? detail::StrCat("token ", b.start_token, " before each document")
                            : detail::StrCat("token ", b.end_token, " after each document");
}

}  // namespace

std::string ManifestOf(const std::string& shard_path) {
  std::string stem = shard_path;
  if (stem.size() > 4 && stem.ends_with(".bin")) stem.resize(stem.size() - 4);
  static const std::regex kNumber("_[0-9]{6}$");
  stem = std::regex_replace(stem, kNumber, "");
  if (stem.ends_with(".val")) stem.resize(stem.size() - 4);
  return stem + ".manifest.json";
}

DocumentBoundary ResolveDocumentBoundary(const DataConfig& data) {
  DocumentBoundary b;
  if (data.document_start_token >= 0 || data.document_end_token >= 0) {
    b.start_token = static_cast<int32_t>(data.document_start_token);
    b.end_token = static_cast<int32_t>(data.document_end_token);
    b.source = b.start_token >= 0 ? "data.document_start_token" : "data.document_end_token";
    return b;
  }
  ZTRAIN_CHECK_T(ConfigError, !data.synthetic(),
                 "data.packed_documents: the built-in synthetic corpus is one stream with no "
                 "documents; set data.train to shards `ztrain data` wrote, or give ", kKeys);
  std::vector<std::string> patterns;
  if (data.train_mixture.empty()) patterns.push_back(data.train);
  for (const DataSourceSpec& s : data.train_mixture) patterns.push_back(s.path);
  std::vector<std::string> manifests;
  for (const std::string& pattern : patterns) {
    for (const std::string& shard : ExpandGlob(pattern)) {
      const std::string m = ManifestOf(shard);
      if (std::find(manifests.begin(), manifests.end(), m) == manifests.end()) {
        manifests.push_back(m);
      }
    }
  }
  bool first = true;
  for (const std::string& path : manifests) {
    ZTRAIN_CHECK_T(ConfigError, fs::exists(path), "data.packed_documents: no corpus manifest '",
                   path, "' beside the shards, so their document tokens are unknown; give ",
                   kKeys, " (llm.c's GPT-2 shards: data.document_start_token = 50256, "
                   "<|endoftext|>)");
    const DocumentBoundary m = FromManifest(path);
    ZTRAIN_CHECK_T(ConfigError, m.start_token >= 0 || m.end_token >= 0,
                   "data.packed_documents: the corpus manifest '", path,
                   "' lists no document tokens (byte tokens, or --bos none --eos none), so the "
                   "documents cannot be told apart; remake the shards with document tokens "
                   "(ztrain data --bos/--eos), or give ", kKeys);
    if (first) {
      b = m;
      first = false;
      continue;
    }
    ZTRAIN_CHECK_T(ConfigError, SameTokens(b, m), "data.packed_documents: ", b.source, " has ",
                   Describe(b), " but ", m.source, " has ", Describe(m),
                   "; train on datasets of one tokenizer, or give ", kKeys);
  }
  return b;
}

int64_t MarkDocuments(const DocumentBoundary& boundary, int64_t rows, int64_t seq,
                      const int32_t* tokens, int32_t* targets, int32_t* positions) {
  ZTRAIN_ASSERT(boundary.start_token >= 0 || boundary.end_token >= 0);
  int64_t documents = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* tok = tokens + r * seq;
    int32_t* tgt = targets + r * seq;
    int32_t* pos = positions + r * seq;
    for (int64_t t = 0; t < seq; ++t) {
      const bool starts = t == 0 || (boundary.start_token >= 0 ? tok[t] == boundary.start_token
                                                                 : tok[t - 1] == boundary.end_token);
      pos[t] = starts ? 0 : pos[t - 1] + 1;
      documents += starts ? 1 : 0;
      // The next token begins another document: no loss across the boundary.
      const bool next_starts = boundary.start_token >= 0 ? tgt[t] == boundary.start_token
                                                         : tok[t] == boundary.end_token;
      if (next_starts) tgt[t] = kIgnoreTarget;
    }
  }
  return documents;
}

}  // namespace ztrain::data
