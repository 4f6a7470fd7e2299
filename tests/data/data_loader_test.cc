#include "data/data_loader.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/random.h"
#include "data/token_shard.h"
#include "tests/data/data_test_util.h"

namespace ztrain::data {
namespace {

using test_util::ExpectErrorWith;
using test_util::TempDir;
using Shards = std::vector<std::vector<uint16_t>>;

Shards RandomShards(const std::vector<int64_t>& sizes, uint64_t seed) {
  Xoshiro256 rng(seed);
  Shards shards;
  for (int64_t size : sizes) {
    std::vector<uint16_t> s(static_cast<size_t>(size));
    for (uint16_t& t : s) t = static_cast<uint16_t>(rng.Below(65536));
    shards.push_back(std::move(s));
  }
  return shards;
}

std::shared_ptr<const TokenSource> MemorySource(const Shards& shards) {
  std::vector<std::string> names;
  for (size_t i = 0; i < shards.size(); ++i) names.push_back("mem" + std::to_string(i));
  return std::make_shared<InMemoryTokenSource>(shards, names);
}

// llm.c's DataLoader with should_shuffle = 0 (llmc/dataloader.h), written from its
// description: shard s holds (ntok - 1) / (R*B*T) samples; sample i of rank r reads B*T+1
// tokens from i*R*B*T + r*B*T; after the last sample of a shard comes the next shard, after
// the last shard the first.
class LlmcReference {
 public:
  LlmcReference(Shards shards, size_t b, size_t t, size_t rank, size_t world)
      : shards_(std::move(shards)), b_(b), t_(t), rank_(rank), world_(world) {}

  size_t NumSamples(size_t shard) const {
    return (shards_[shard].size() * sizeof(uint16_t) - sizeof(uint16_t)) /
           (world_ * b_ * t_ * sizeof(uint16_t));
  }

  // Expected tokens and targets, row-major [B, T].
  void Next(std::vector<int32_t>* tokens, std::vector<int32_t>* targets) {
    if (sample_ >= NumSamples(shard_)) {
      shard_ = shard_ == shards_.size() - 1 ? 0 : shard_ + 1;
      sample_ = 0;
    }
    const size_t offset = sample_ * world_ * b_ * t_ + rank_ * b_ * t_;
    tokens->clear();
    targets->clear();
    for (size_t i = 0; i < b_ * t_; ++i) {
      tokens->push_back(shards_[shard_][offset + i]);
      targets->push_back(shards_[shard_][offset + i + 1]);
    }
    ++sample_;
  }

 private:
  Shards shards_;
  size_t b_, t_, rank_, world_;
  size_t shard_ = 0;
  size_t sample_ = 0;
};

std::vector<int32_t> AsVector(const Tensor& t) {
  return {t.data<int32_t>(), t.data<int32_t>() + t.numel()};
}

// Runs `batches` batches of the loader and of the reference and compares them.
void ExpectMatchesLlmc(const Shards& shards, int64_t b, int64_t t, int rank, int world,
                       int batches) {
  LoaderOptions options;
  options.batch_size = b;
  options.seq_len = t;
  options.rank = rank;
  options.world = world;
  DataLoader loader(MemorySource(shards), options);
  LlmcReference ref(shards, b, t, rank, world);
  std::vector<int32_t> tokens, targets;
  for (int i = 0; i < batches; ++i) {
    const Batch batch = loader.NextBatch();
    ASSERT_EQ(batch.tokens.shape(), (Shape{b, t}));
    ASSERT_EQ(batch.tokens.dtype(), DType::kI32);
    ref.Next(&tokens, &targets);
    ASSERT_EQ(AsVector(batch.tokens), tokens) << "batch " << i << " B=" << b << " T=" << t;
    ASSERT_EQ(AsVector(batch.targets), targets) << "batch " << i;
  }
}

TEST(DataLoaderTest, OneShardMatchesLlmcThroughWrapAround) {
  const Shards shards = RandomShards({1000}, 1);
  for (auto [b, t] : {std::pair<int64_t, int64_t>{4, 8}, {1, 1}, {3, 17}, {1, 999}, {7, 10}}) {
    ExpectMatchesLlmc(shards, b, t, 0, 1, 200);
  }
}

TEST(DataLoaderTest, ManyShardsMatchLlmcAcrossShardSwitches) {
  // Sizes around multiples of B*T = 32: exactly one batch (33), a remainder that is not
  // enough for another batch (64 = 2*32, needing 65), and uneven sizes.
  const Shards shards = RandomShards({33, 64, 65, 100, 129, 500}, 2);
  for (auto [b, t] : {std::pair<int64_t, int64_t>{4, 8}, {2, 16}, {8, 4}, {1, 32}, {1, 5}}) {
    ExpectMatchesLlmc(shards, b, t, 0, 1, 300);
  }
}

TEST(DataLoaderTest, RanksMatchLlmcMultiProcess) {
  const Shards shards = RandomShards({97, 200, 64, 301}, 3);
  for (int world : {2, 3}) {
    for (int rank = 0; rank < world; ++rank) ExpectMatchesLlmc(shards, 2, 5, rank, world, 150);
  }
}

TEST(DataLoaderTest, RanksSplitTheSingleProcessBatch) {
  const Shards shards = RandomShards({500, 333}, 4);
  const int world = 3;
  const int64_t b = 2, t = 7;
  LoaderOptions whole;
  whole.batch_size = world * b;
  whole.seq_len = t;
  DataLoader single(MemorySource(shards), whole);
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int r = 0; r < world; ++r) {
    LoaderOptions o = whole;
    o.batch_size = b;
    o.rank = r;
    o.world = world;
    ranks.push_back(std::make_unique<DataLoader>(MemorySource(shards), o));
  }
  for (int step = 0; step < 60; ++step) {
    const std::vector<int32_t> all = AsVector(single.NextBatch().tokens);
    for (int r = 0; r < world; ++r) {
      const std::vector<int32_t> part = AsVector(ranks[r]->NextBatch().tokens);
      ASSERT_EQ(part, std::vector<int32_t>(all.begin() + r * b * t, all.begin() + (r + 1) * b * t))
          << "step " << step << " rank " << r;
    }
  }
}

TEST(DataLoaderTest, CountsBatchesPerEpochAndAdvancesTheState) {
  const Shards shards = RandomShards({65, 100, 40}, 5);  // B*T = 8: 8 + 12 + 4 batches
  LoaderOptions o;
  o.batch_size = 2;
  o.seq_len = 4;
  DataLoader loader(MemorySource(shards), o);
  EXPECT_EQ(loader.batches_per_epoch(), 24);
  EXPECT_EQ(loader.state(), (LoaderState{0, 0, 0}));
  loader.NextBatch();
  EXPECT_EQ(loader.state(), (LoaderState{0, 0, 8}));
  for (int i = 1; i < 8; ++i) loader.NextBatch();
  EXPECT_EQ(loader.state(), (LoaderState{0, 1, 0}));
  for (int i = 8; i < 24; ++i) loader.NextBatch();
  EXPECT_EQ(loader.state(), (LoaderState{1, 0, 0}));
}

TEST(DataLoaderTest, RestoresASavedStateAndResets) {
  const Shards shards = RandomShards({300, 211, 150}, 6);
  LoaderOptions o;
  o.batch_size = 3;
  o.seq_len = 9;
  DataLoader a(MemorySource(shards), o);
  std::vector<std::vector<int32_t>> first;
  for (int i = 0; i < 5; ++i) first.push_back(AsVector(a.NextBatch().targets));
  for (int i = 0; i < 17; ++i) a.NextBatch();
  const LoaderState saved = a.state();
  std::vector<std::vector<int32_t>> after;
  for (int i = 0; i < 20; ++i) after.push_back(AsVector(a.NextBatch().targets));

  DataLoader b(MemorySource(shards), o);
  b.Restore(saved);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(AsVector(b.NextBatch().targets), after[i]) << i;
  b.Reset();
  EXPECT_EQ(b.state(), LoaderState{});
  for (int i = 0; i < 5; ++i) EXPECT_EQ(AsVector(b.NextBatch().targets), first[i]) << i;
}

TEST(DataLoaderTest, RefusesAStateThatDoesNotFit) {
  const Shards shards = RandomShards({100, 50}, 7);
  LoaderOptions o;
  o.batch_size = 2;
  o.seq_len = 8;
  DataLoader loader(MemorySource(shards), o);
  ExpectErrorWith<ConfigError>([&] { loader.Restore({0, 2, 0}); }, {"shard 2 of 2"});
  ExpectErrorWith<ConfigError>([&] { loader.Restore({0, 1, 40}); }, {"position 40"});
  ExpectErrorWith<ConfigError>([&] { loader.Restore({-1, 0, 0}); }, {"epoch -1"});
  EXPECT_EQ(loader.state(), LoaderState{});
}

TEST(DataLoaderTest, WritesIntoCallerTensors) {
  const Shards shards = RandomShards({200}, 8);
  LoaderOptions o;
  o.batch_size = 2;
  o.seq_len = 5;
  DataLoader loader(MemorySource(shards), o);
  std::vector<int32_t> tokens(10), targets(10);
  loader.NextBatch(Tensor(tokens.data(), DType::kI32, {2, 5}),
                   Tensor(targets.data(), DType::kI32, {2, 5}));
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(tokens[i], shards[0][i]);
    EXPECT_EQ(targets[i], shards[0][i + 1]);
  }
  ExpectErrorWith<Error>(
      [&] {
        loader.NextBatch(Tensor(tokens.data(), DType::kI32, {5, 2}),
                         Tensor(targets.data(), DType::kI32, {2, 5}));
      },
      {"tokens", "[2, 5]"});
}

TEST(DataLoaderTest, ReadsShardFilesLikeMemory) {
  TempDir dir;
  const Shards shards = RandomShards({120, 77, 300}, 9);
  for (size_t i = 0; i < shards.size(); ++i) {
    WriteTokenShard(dir.File("d_train_00000" + std::to_string(i) + ".bin"), shards[i],
                    TokenFormat::kUint16);
  }
  auto files = std::make_shared<ShardFileSource>(dir.File("d_train_*.bin"));
  ASSERT_EQ(files->num_shards(), 3);
  EXPECT_EQ(files->shard_name(1), dir.File("d_train_000001.bin"));
  EXPECT_EQ(files->num_tokens(), 497);
  LoaderOptions o;
  o.batch_size = 4;
  o.seq_len = 8;
  DataLoader from_files(files, o);
  DataLoader from_memory(MemorySource(shards), o);
  for (int i = 0; i < 40; ++i) {
    ASSERT_EQ(AsVector(from_files.NextBatch().tokens), AsVector(from_memory.NextBatch().tokens));
  }
}

TEST(DataLoaderTest, ShardTooSmallForOneBatchIsNamed) {
  const Shards shards = RandomShards({100, 32, 100}, 10);
  LoaderOptions o;
  o.batch_size = 4;
  o.seq_len = 8;
  ExpectErrorWith<ConfigError>([&] { DataLoader loader(MemorySource(shards), o); },
                               {"'mem1'", "32 tokens", "B*T+1 = 33"});
  o.batch_size = 2;
  o.world = 3;
  o.rank = 1;
  ExpectErrorWith<ConfigError>([&] { DataLoader loader(MemorySource(shards), o); },
                               {"'mem1'", "32 tokens", "world*B*T+1 = 49", "world=3"});
}

TEST(DataLoaderTest, RejectsBadOptions) {
  const Shards shards = RandomShards({100}, 11);
  LoaderOptions o;
  o.batch_size = 1;
  o.seq_len = 0;
  ExpectErrorWith<ConfigError>([&] { DataLoader loader(MemorySource(shards), o); }, {"T=0"});
  o.seq_len = 4;
  o.rank = 2;
  o.world = 2;
  ExpectErrorWith<ConfigError>([&] { DataLoader loader(MemorySource(shards), o); },
                               {"rank 2", "world of 2"});
}

// A bad token deep in the last shard is found when the loader opens the data, before any batch
// (it used to end a run at the step that read it), naming the shard, the token, its index and
// the vocabulary the data was made for.
TEST(DataLoaderTest, OutOfRangeTokenIsReportedWhenTheDataIsOpened) {
  TempDir dir;
  std::vector<uint16_t> good(200), bad(5000);
  for (size_t i = 0; i < good.size(); ++i) good[i] = static_cast<uint16_t>(i % 100);
  for (size_t i = 0; i < bad.size(); ++i) bad[i] = static_cast<uint16_t>(i % 100);
  bad[4321] = 150;
  bad[4500] = 499;
  WriteTokenShard(dir.File("a.bin"), good, TokenFormat::kUint16);
  WriteTokenShard(dir.File("b.bin"), bad, TokenFormat::kUint16);
  LoaderOptions o;
  o.batch_size = 2;
  o.seq_len = 8;
  o.vocab_size = 100;
  const auto source = std::make_shared<ShardFileSource>(dir.File("*.bin"));
  ExpectErrorWith<IoError>([&] { DataLoader loader(source, o); },
                           {"token 150", "index 4321", dir.File("b.bin"), "vocab_size 100",
                            "largest token is 499", "at least 500"});
  o.vocab_size = 500;  // large enough: opens, and reads every token
  DataLoader loader(source, o);
  for (int i = 0; i < 300; ++i) loader.NextBatch();
}

}  // namespace
}  // namespace ztrain::data
