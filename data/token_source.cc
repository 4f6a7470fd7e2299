#include "data/token_source.h"

#include <algorithm>
#include <utility>

#include "core/config.h"
#include "core/error.h"
#include "core/logging.h"
#include "data/synthetic_corpus.h"

namespace ztrain::data {

int64_t TokenSource::num_tokens() const {
  int64_t total = 0;
  for (int64_t i = 0; i < num_shards(); ++i) total += static_cast<int64_t>(shard(i).size());
  return total;
}

void TokenSource::CheckVocabulary(int64_t vocab_size) const {
  if (vocab_size > 65535) return;  // every uint16 token is in range
  const int64_t total = num_tokens();
  if (total > (int64_t{1} << 28)) {
    Log().info("data: checking {} tokens in {} shards against vocab_size {}", total, num_shards(),
               vocab_size);
  }
  for (int64_t s = 0; s < num_shards(); ++s) {
    const std::span<const uint16_t> tokens = shard(s);
    const int64_t n = static_cast<int64_t>(tokens.size());
    uint16_t largest = 0;
#pragma omp parallel for reduction(max : largest) schedule(static)
    for (int64_t i = 0; i < n; ++i) largest = std::max(largest, tokens[static_cast<size_t>(i)]);
    if (largest < vocab_size) continue;
    const auto bad = std::find_if(tokens.begin(), tokens.end(),
                                  [&](uint16_t t) { return t >= vocab_size; });
    throw IoError(detail::StrCat(
        "token ", *bad, " at index ", bad - tokens.begin(), " of shard '", shard_name(s),
        "' is outside the vocabulary (vocab_size ", vocab_size, "; the shard's largest token is ",
        largest, "): the data was tokenized for a larger vocabulary; set model.vocab_size to at "
        "least ", largest + 1, " or tokenize the data with the model's tokenizer"));
  }
}

InMemoryTokenSource::InMemoryTokenSource(std::vector<std::vector<uint16_t>> shards,
                                         std::vector<std::string> names)
    : shards_(std::move(shards)), names_(std::move(names)) {
  ZTRAIN_CHECK_T(ConfigError, !shards_.empty(), "a token source needs at least one shard");
  ZTRAIN_CHECK_T(ConfigError, shards_.size() == names_.size(), "InMemoryTokenSource got ",
                 shards_.size(), " shards but ", names_.size(), " names");
  for (size_t i = 0; i < shards_.size(); ++i) {
    ZTRAIN_CHECK_T(ConfigError, !shards_[i].empty(), "token shard '", names_[i], "' is empty");
  }
}

ShardFileSource::ShardFileSource(const std::string& pattern) {
  for (const std::string& path : ExpandGlob(pattern)) shards_.push_back(TokenShard::Open(path));
}

std::shared_ptr<const TokenSource> OpenDataSource(const DataConfig& config, Split split,
                                                  int64_t vocab_size, uint64_t seed) {
  const std::string& pattern = split == Split::kTrain ? config.train : config.val;
  if (!pattern.empty()) return std::make_shared<ShardFileSource>(pattern);
  if (!config.train.empty()) return nullptr;  // files for training, no validation set
  SyntheticCorpusOptions options;
  options.vocab_size = vocab_size;
  options.seed = seed;
  return MakeSyntheticSource(options, split);
}

}  // namespace ztrain::data
