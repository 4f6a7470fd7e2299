// The loader over uint16 and uint32 shards (llm.c's gpt-2 and llama-3 formats): the batches
// depend on the token ids only, never on the width they were stored in, and ids above 65,535
// arrive whole.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/data_loader.h"
#include "data/random.h"
#include "data/token_shard.h"
#include "tests/data/data_test_util.h"

namespace ztrain::data {
namespace {

using test_util::ExpectErrorWith;
using test_util::TempDir;

// Ids 70,000 and up: none of them fits uint16, and none survives a cut to 16 bits unchanged.
constexpr uint32_t kAbove16 = 70'000;

std::vector<std::vector<uint16_t>> RandomShards(const std::vector<int64_t>& sizes, uint64_t seed) {
  Xoshiro256 rng(seed);
  std::vector<std::vector<uint16_t>> shards;
  for (int64_t size : sizes) {
    std::vector<uint16_t> s(static_cast<size_t>(size));
    for (uint16_t& t : s) t = static_cast<uint16_t>(rng.Below(65536));
    shards.push_back(std::move(s));
  }
  return shards;
}

std::vector<uint32_t> Shifted(const std::vector<uint16_t>& tokens, uint32_t by) {
  std::vector<uint32_t> out(tokens.begin(), tokens.end());
  for (uint32_t& t : out) t += by;
  return out;
}

// Writes shard i as dir/<stem>_00000i.bin in formats[i]; returns the glob that reads them.
std::string WriteShards(const TempDir& dir, const std::string& stem,
                        const std::vector<std::vector<uint32_t>>& shards,
                        const std::vector<TokenFormat>& formats) {
  for (size_t i = 0; i < shards.size(); ++i) {
    WriteTokenShard(dir.File(stem + "_00000" + std::to_string(i) + ".bin"), shards[i], formats[i]);
  }
  return dir.File(stem + "_*.bin");
}

std::vector<std::vector<uint32_t>> Widened(const std::vector<std::vector<uint16_t>>& shards,
                                           uint32_t by = 0) {
  std::vector<std::vector<uint32_t>> out;
  for (const auto& s : shards) out.push_back(Shifted(s, by));
  return out;
}

// `batches` batches of tokens then targets, concatenated.
std::vector<int32_t> Read(std::shared_ptr<const TokenSource> source, const LoaderOptions& o,
                          int batches) {
  DataLoader loader(std::move(source), o);
  std::vector<int32_t> out;
  for (int i = 0; i < batches; ++i) {
    const Batch b = loader.NextBatch();
    out.insert(out.end(), b.tokens.data<int32_t>(), b.tokens.data<int32_t>() + b.tokens.numel());
    out.insert(out.end(), b.targets.data<int32_t>(), b.targets.data<int32_t>() + b.targets.numel());
  }
  return out;
}

LoaderOptions Options(bool shuffle, int64_t vocab_size) {
  LoaderOptions o;
  o.batch_size = 3;
  o.seq_len = 8;
  o.rank = 1;
  o.world = 2;
  o.shuffle = shuffle;
  o.seed = 17;
  o.vocab_size = vocab_size;
  return o;
}

// The same ids below 65,536 stored as uint16, as uint32, and mixed in one glob: the same
// batches, in both orders, over more than two epochs (every shard boundary and wrap).
TEST(LoaderFormatsTest, SameIdsGiveTheSameBatchesInEitherWidth) {
  TempDir dir;
  const auto shards = Widened(RandomShards({200, 131, 350}, 3));
  using F = TokenFormat;
  const std::string narrow = WriteShards(dir, "n", shards, {F::kUint16, F::kUint16, F::kUint16});
  const std::string wide = WriteShards(dir, "w", shards, {F::kUint32, F::kUint32, F::kUint32});
  const std::string mixed = WriteShards(dir, "m", shards, {F::kUint32, F::kUint16, F::kUint32});
  const auto mixed_source = std::make_shared<ShardFileSource>(mixed);
  EXPECT_EQ(mixed_source->shard(0).format(), F::kUint32);
  EXPECT_EQ(mixed_source->shard(1).format(), F::kUint16);
  for (bool shuffle : {false, true}) {
    SCOPED_TRACE(shuffle ? "shuffled" : "sequential");
    const LoaderOptions o = Options(shuffle, 65536);
    const std::vector<int32_t> want = Read(std::make_shared<ShardFileSource>(narrow), o, 70);
    ASSERT_EQ(want.size(), 70u * 2 * 3 * 8);
    EXPECT_EQ(Read(std::make_shared<ShardFileSource>(wide), o, 70), want);
    EXPECT_EQ(Read(mixed_source, o, 70), want);
    const std::vector<std::string> names = {"a", "b", "c"};
    EXPECT_EQ(Read(std::make_shared<InMemoryTokenSource>(shards, names), o, 70), want);
  }
}

// Every id of a uint32 shard moved above 65,535: each batch is the uint16 batch of the
// original ids moved by the same amount, token for token.
TEST(LoaderFormatsTest, IdsAbove65535GiveTheWindowsOfTheUint16Path) {
  TempDir dir;
  const auto ids = RandomShards({200, 131, 350}, 4);
  using F = TokenFormat;
  const std::string narrow =
      WriteShards(dir, "n", Widened(ids), {F::kUint16, F::kUint16, F::kUint16});
  const std::string wide =
      WriteShards(dir, "w", Widened(ids, kAbove16), {F::kUint32, F::kUint32, F::kUint32});
  for (bool shuffle : {false, true}) {
    SCOPED_TRACE(shuffle ? "shuffled" : "sequential");
    const std::vector<int32_t> low =
        Read(std::make_shared<ShardFileSource>(narrow), Options(shuffle, 65536), 70);
    const std::vector<int32_t> high =
        Read(std::make_shared<ShardFileSource>(wide), Options(shuffle, 65536 + kAbove16), 70);
    ASSERT_EQ(high.size(), low.size());
    for (size_t i = 0; i < low.size(); ++i) {
      ASSERT_EQ(high[i], low[i] + static_cast<int32_t>(kAbove16)) << "element " << i;
    }
  }
  // Sequential, rank 1 of 2, B=3, T=8: the first batch starts at token 24 of the first shard.
  const std::vector<int32_t> first =
      Read(std::make_shared<ShardFileSource>(wide), Options(false, 65536 + kAbove16), 1);
  EXPECT_EQ(first[0], static_cast<int32_t>(ids[0][24] + kAbove16));
  EXPECT_EQ(first[3 * 8], static_cast<int32_t>(ids[0][25] + kAbove16));  // its first target
}

// Llama-3's vocabulary: ids up to 128,255 open with vocab_size 128,256; one id past a smaller
// vocabulary is named, in a uint32 shard (which, unlike uint16, is checked above 65,535).
TEST(LoaderFormatsTest, Uint32IdsAreCheckedAgainstTheVocabulary) {
  TempDir dir;
  std::vector<uint32_t> good(300), bad(5000);
  for (size_t i = 0; i < good.size(); ++i) good[i] = static_cast<uint32_t>(128'000 + i % 256);
  for (size_t i = 0; i < bad.size(); ++i) bad[i] = static_cast<uint32_t>(i % 100);
  bad[4321] = 70'000;
  bad[4500] = 128'255;
  WriteTokenShard(dir.File("a.bin"), good, TokenFormat::kUint32);
  WriteTokenShard(dir.File("b.bin"), bad, TokenFormat::kUint32);
  const auto source = std::make_shared<ShardFileSource>(dir.File("*.bin"));
  LoaderOptions o = Options(false, 65536);
  ExpectErrorWith<IoError>([&] { DataLoader loader(source, o); },
                           {"token 128000 at index 0", dir.File("a.bin"), "vocab_size 65536",
                            "largest token is 128255", "at least 128256"});
  o.vocab_size = 128'000;
  ExpectErrorWith<IoError>([&] { DataLoader loader(source, o); },
                           {"token 128000 at index 0", dir.File("a.bin"), "vocab_size 128000"});
  o.vocab_size = 128'256;
  DataLoader loader(source, o);
  EXPECT_EQ(loader.NextBatch().tokens.data<int32_t>()[0], 128'000 + 24);

  const auto only_bad = std::make_shared<ShardFileSource>(dir.File("b.bin"));
  o.vocab_size = 65536;
  ExpectErrorWith<IoError>([&] { DataLoader l(only_bad, o); },
                           {"token 70000 at index 4321", "largest token is 128255"});
}

TEST(LoaderFormatsTest, RefusesAVocabularyBeyondInt32) {
  const std::vector<std::vector<uint32_t>> shards = {std::vector<uint32_t>(100, 1)};
  const auto source = std::make_shared<InMemoryTokenSource>(shards, std::vector<std::string>{"a"});
  LoaderOptions o = Options(false, (int64_t{1} << 31) + 1);
  o.world = 1;
  o.rank = 0;
  ExpectErrorWith<ConfigError>([&] { DataLoader loader(source, o); },
                               {"vocab_size in [1, 2^31]", "2147483649"});
  o.vocab_size = int64_t{1} << 31;
  EXPECT_NO_THROW(DataLoader loader(source, o));
}

}  // namespace
}  // namespace ztrain::data
