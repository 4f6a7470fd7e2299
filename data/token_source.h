#pragma once
// TokenSource: an ordered list of token shards that a DataLoader reads from.
//
// Two implementations: ShardFileSource maps llm.c `.bin` shards matched by a glob (read-only,
// pages load on demand; uint16 and uint32 shards may be mixed), InMemoryTokenSource holds
// token vectors (the synthetic corpus, tests). A shard's tokens are a TokenSpan in the format
// they are stored in; readers widen them. A source is immutable after construction and may be
// shared by several loaders and threads. Construction fails with IoError (file problems) or
// ConfigError (bad arguments).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/token_shard.h"

namespace ztrain {
struct DataConfig;
}  // namespace ztrain

namespace ztrain::data {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t num_shards() const = 0;
  virtual TokenSpan shard(int64_t i) const = 0;
  // The name used in error messages: the file path, or e.g. "synthetic:train".
  virtual const std::string& shard_name(int64_t i) const = 0;
  int64_t num_tokens() const;
  // Checks that every token of every shard is below `vocab_size`, so that a bad token is found
  // when the data is opened, not at the step that reaches it. IoError naming the shard, the
  // first bad token and its index, and the largest token (the vocabulary it was made for).
  void CheckVocabulary(int64_t vocab_size) const;
};

class InMemoryTokenSource final : public TokenSource {
 public:
  // One name per shard; every shard holds at least one token.
  InMemoryTokenSource(std::vector<std::vector<uint16_t>> shards, std::vector<std::string> names);
  InMemoryTokenSource(std::vector<std::vector<uint32_t>> shards, std::vector<std::string> names);
  int64_t num_shards() const override { return static_cast<int64_t>(names_.size()); }
  TokenSpan shard(int64_t i) const override;
  const std::string& shard_name(int64_t i) const override { return names_.at(i); }

 private:
  // ConfigError unless there are `num_shards` names, at least one shard, none empty.
  void CheckShards(size_t num_shards) const;

  // One of the two holds the shards, the other is empty.
  std::vector<std::vector<uint16_t>> shards16_;
  std::vector<std::vector<uint32_t>> shards32_;
  std::vector<std::string> names_;
};

class ShardFileSource final : public TokenSource {
 public:
  // Opens and validates every shard matching `pattern` (ExpandGlob), in sorted order.
  explicit ShardFileSource(const std::string& pattern);
  int64_t num_shards() const override { return static_cast<int64_t>(shards_.size()); }
  TokenSpan shard(int64_t i) const override { return shards_.at(i).tokens(); }
  const std::string& shard_name(int64_t i) const override { return shards_.at(i).path(); }

 private:
  std::vector<TokenShard> shards_;
};

enum class Split { kTrain, kVal };

// The source a run reads for `split` (DataConfig): the shards matching data.train / data.val,
// or, when data.train is empty, the built-in synthetic corpus over `vocab_size` tokens
// generated from `seed` (SyntheticCorpusOptions defaults for the sizes). Returns nullptr for
// kVal when data.val is empty but data.train is not (no evaluation). Not for a mixture's
// training data (data/mixture.h: OpenTrainMixture).
std::shared_ptr<const TokenSource> OpenDataSource(const DataConfig& config, Split split,
                                                  int64_t vocab_size, uint64_t seed);

}  // namespace ztrain::data
