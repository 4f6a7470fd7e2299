#include "data/token_source.h"

#include <algorithm>
#include <span>
#include <utility>

#include "core/config.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/staged_output.h"
#include "data/synthetic_corpus.h"

namespace ztrain::data {

namespace {

// Whether every token of a `format` shard is below `vocab_size` whatever the shard holds.
bool AlwaysInVocabulary(TokenFormat format, int64_t vocab_size) {
  return format == TokenFormat::kUint16 && vocab_size >= kUint16Vocabulary;
}

template <class T>
int64_t Largest(std::span<const T> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  T largest = 0;
#pragma omp parallel for reduction(max : largest) schedule(static)
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, tokens[static_cast<size_t>(i)]);
  return largest;
}

template <class T>
int64_t FirstOutside(std::span<const T> tokens, int64_t vocab_size) {
  return std::find_if(tokens.begin(), tokens.end(), [&](T t) { return t >= vocab_size; }) -
         tokens.begin();
}

}  // namespace

int64_t TokenSource::num_tokens() const {
  int64_t total = 0;
  for (int64_t i = 0; i < num_shards(); ++i) total += static_cast<int64_t>(shard(i).size());
  return total;
}

void TokenSource::CheckVocabulary(int64_t vocab_size) const {
  int64_t to_check = 0, shards_to_check = 0;
  for (int64_t s = 0; s < num_shards(); ++s) {
    const TokenSpan tokens = shard(s);
    if (AlwaysInVocabulary(tokens.format(), vocab_size)) continue;
    to_check += static_cast<int64_t>(tokens.size());
    ++shards_to_check;
  }
  if (to_check > (int64_t{1} << 28)) {
    Log().info("data: checking {} tokens in {} shards against vocab_size {}", to_check,
               shards_to_check, vocab_size);
  }
  for (int64_t s = 0; s < num_shards(); ++s) {
    const TokenSpan tokens = shard(s);
    if (AlwaysInVocabulary(tokens.format(), vocab_size)) continue;
    const int64_t largest = tokens.Visit([](auto t) { return Largest(t); });
    if (largest < vocab_size) continue;
    const int64_t bad = tokens.Visit([&](auto t) { return FirstOutside(t, vocab_size); });
    throw IoError(detail::StrCat(
        "token ", tokens[static_cast<size_t>(bad)], " at index ", bad, " of shard '", shard_name(s),
        "' is outside the vocabulary (vocab_size ", vocab_size, "; the shard's largest token is ",
        largest,
        "): the data was tokenized for a larger vocabulary; set model.vocab_size to at least ",
        largest + 1, " or tokenize the data with the model's tokenizer"));
  }
}

InMemoryTokenSource::InMemoryTokenSource(std::vector<std::vector<uint16_t>> shards,
                                         std::vector<std::string> names)
    : shards16_(std::move(shards)), names_(std::move(names)) {
  CheckShards(shards16_.size());
}

InMemoryTokenSource::InMemoryTokenSource(std::vector<std::vector<uint32_t>> shards,
                                         std::vector<std::string> names)
    : shards32_(std::move(shards)), names_(std::move(names)) {
  CheckShards(shards32_.size());
}

void InMemoryTokenSource::CheckShards(size_t num_shards) const {
  ZTRAIN_CHECK_T(ConfigError, num_shards == names_.size(), "InMemoryTokenSource got ", num_shards,
                 " shards but ", names_.size(), " names");
  ZTRAIN_CHECK_T(ConfigError, !names_.empty(), "a token source needs at least one shard");
  for (int64_t i = 0; i < this->num_shards(); ++i) {
    ZTRAIN_CHECK_T(ConfigError, !shard(i).empty(), "token shard '", names_[i], "' is empty");
  }
}

TokenSpan InMemoryTokenSource::shard(int64_t i) const {
  if (shards32_.empty()) return shards16_.at(static_cast<size_t>(i));
  return shards32_.at(static_cast<size_t>(i));
}

ShardFileSource::ShardFileSource(const std::string& pattern) {
  const std::vector<std::string> paths = ExpandGlob(pattern);
  // Never a corpus that a killed `ztrain data` left half in place (Note [Staged file sets]).
  CheckNoUnfinishedCommit(paths, "the data");
  for (const std::string& path : paths) shards_.push_back(TokenShard::Open(path));
}

std::shared_ptr<const TokenSource> OpenDataSource(const DataConfig& config, Split split,
                                                  int64_t vocab_size, uint64_t seed) {
  ZTRAIN_ASSERT(split == Split::kVal || config.train_mixture.empty(),
                "a mixture's sources come from OpenTrainMixture");
  const std::string& pattern = split == Split::kTrain ? config.train : config.val;
  if (!pattern.empty()) return std::make_shared<ShardFileSource>(pattern);
  if (!config.synthetic()) return nullptr;  // files for training, no validation set
  SyntheticCorpusOptions options;
  options.vocab_size = vocab_size;
  options.seed = seed;
  return MakeSyntheticSource(options, split);
}

}  // namespace ztrain::data
