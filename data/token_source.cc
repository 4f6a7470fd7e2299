#include "data/token_source.h"

#include <utility>

#include "core/config.h"
#include "core/error.h"
#include "data/synthetic_corpus.h"

namespace ztrain::data {

int64_t TokenSource::num_tokens() const {
  int64_t total = 0;
  for (int64_t i = 0; i < num_shards(); ++i) total += static_cast<int64_t>(shard(i).size());
  return total;
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
