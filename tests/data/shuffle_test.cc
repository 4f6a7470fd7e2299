// The shuffled order (Note [Shuffle order]) and its building blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/data_loader.h"
#include "data/random.h"
#include "data/window_permutation.h"
#include "tests/data/data_test_util.h"

namespace ztrain::data {
namespace {

using test_util::ExpectErrorWith;
using Window = std::pair<int, int>;  // (shard, position)
using Windows = std::vector<Window>;

TEST(RandomTest, SplitMixMatchesTheReferenceSequence) {
  // SplitMix64 from state 0 (Vigna's splitmix64.c): outputs are Mix64(k * golden ratio).
  EXPECT_EQ(Mix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(Mix64(0x9e3779b97f4a7c15ull), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(Mix64(0x3c6ef372fe94f82aull), 0x06c45d188009454full);
}

TEST(RandomTest, BelowIsUniform) {
  Xoshiro256 rng(42);
  std::vector<int> counts(6);
  for (int i = 0; i < 60000; ++i) ++counts[rng.Below(6)];
  for (int c : counts) EXPECT_NEAR(c, 10000, 400);  // ~4.4 standard deviations
}

std::vector<uint64_t> Image(const WindowPermutation& p) {
  std::vector<uint64_t> out;
  for (uint64_t i = 0; i < p.size(); ++i) out.push_back(p(i));
  return out;
}

TEST(WindowPermutationTest, IsABijectionForEverySize) {
  std::vector<uint64_t> sizes;
  for (uint64_t n = 1; n <= 300; ++n) sizes.push_back(n);
  sizes.insert(sizes.end(), {1023, 1024, 1025, 4096, 100'003});
  for (uint64_t n : sizes) {
    std::vector<uint64_t> image = Image(WindowPermutation(n, DeriveSeed(n, 3)));
    std::sort(image.begin(), image.end());
    std::vector<uint64_t> identity(n);
    std::iota(identity.begin(), identity.end(), 0);
    ASSERT_EQ(image, identity) << "n=" << n;
  }
}

TEST(WindowPermutationTest, DependsOnlyOnTheKey) {
  EXPECT_EQ(Image(WindowPermutation(1000, 5)), Image(WindowPermutation(1000, 5)));
  EXPECT_NE(Image(WindowPermutation(1000, 5)), Image(WindowPermutation(1000, 6)));
}

TEST(WindowPermutationTest, LooksShuffled) {
  const std::vector<uint64_t> image = Image(WindowPermutation(10000, 77));
  int fixed = 0, ascending_pairs = 0;
  double displacement = 0;
  for (uint64_t i = 0; i < image.size(); ++i) {
    fixed += image[i] == i;
    if (i > 0) ascending_pairs += image[i] == image[i - 1] + 1;
    displacement += std::abs(static_cast<double>(image[i]) - static_cast<double>(i));
  }
  // A uniform permutation has about 1 fixed point, 1 ascending neighbour pair and a mean
  // displacement of n/3.
  EXPECT_LT(fixed, 10);
  EXPECT_LT(ascending_pairs, 10);
  EXPECT_NEAR(displacement / 10000, 10000 / 3.0, 150);
}

// Shards whose tokens encode their (shard, position): token = shard * 4096 + position.
std::shared_ptr<const TokenSource> PositionSource(const std::vector<int64_t>& sizes) {
  std::vector<std::vector<uint16_t>> shards;
  std::vector<std::string> names;
  for (size_t s = 0; s < sizes.size(); ++s) {
    std::vector<uint16_t> tokens(static_cast<size_t>(sizes[s]));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(s * 4096 + i);
    shards.push_back(std::move(tokens));
    names.push_back("pos" + std::to_string(s));
  }
  return std::make_shared<InMemoryTokenSource>(std::move(shards), std::move(names));
}

LoaderOptions Shuffled(int64_t b, int64_t t, uint64_t seed, int rank = 0, int world = 1) {
  LoaderOptions o;
  o.batch_size = b;
  o.seq_len = t;
  o.shuffle = true;
  o.seed = seed;
  o.rank = rank;
  o.world = world;
  return o;
}

// The (shard, position) of every row of the next batch, checking that each row is a
// contiguous window of T+1 tokens at a multiple of T.
Windows NextWindows(DataLoader& loader) {
  const Batch batch = loader.NextBatch();
  const int64_t b = batch.tokens.size(0), t = batch.tokens.size(1);
  const int32_t* tok = batch.tokens.data<int32_t>();
  const int32_t* tgt = batch.targets.data<int32_t>();
  Windows rows;
  for (int64_t r = 0; r < b; ++r) {
    const int32_t first = tok[r * t];
    for (int64_t i = 0; i < t; ++i) {
      EXPECT_EQ(tok[r * t + i], first + i);
      EXPECT_EQ(tgt[r * t + i], first + i + 1);
    }
    EXPECT_EQ(first % 4096 % t, 0) << "window not at a multiple of T";
    rows.emplace_back(first / 4096, first % 4096);
  }
  return rows;
}

Windows AllWindows(const std::vector<int64_t>& sizes, int64_t t) {
  Windows all;
  for (size_t s = 0; s < sizes.size(); ++s) {
    for (int64_t p = 0; p + t + 1 <= sizes[s]; p += t) all.emplace_back(s, p);
  }
  return all;
}

Windows Epoch(DataLoader& loader) {
  Windows order;
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
    for (const auto& w : NextWindows(loader)) order.push_back(w);
  }
  return order;
}

TEST(ShuffledLoaderTest, EachEpochCoversEveryWindowOnce) {
  const std::vector<int64_t> sizes = {101, 41, 90};  // T = 10: 10 + 4 + 8 = 22 windows
  DataLoader loader(PositionSource(sizes), Shuffled(2, 10, 1234));
  ASSERT_EQ(loader.num_windows(), 22);
  ASSERT_EQ(loader.batches_per_epoch(), 11);
  Windows expected = AllWindows(sizes, 10);
  std::vector<Windows> epochs;
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(loader.state(), (LoaderState{e, 0, 0}));
    epochs.push_back(Epoch(loader));
    Windows sorted = epochs.back();
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, expected) << "epoch " << e;
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  EXPECT_NE(epochs[0], expected);  // not the file order
}

TEST(ShuffledLoaderTest, OrderDependsOnlyOnTheSeed) {
  const std::vector<int64_t> sizes = {500, 300};
  DataLoader a(PositionSource(sizes), Shuffled(4, 16, 99));
  DataLoader b(PositionSource(sizes), Shuffled(4, 16, 99));
  DataLoader c(PositionSource(sizes), Shuffled(4, 16, 100));
  const auto epoch_a = Epoch(a);
  EXPECT_EQ(epoch_a, Epoch(b));
  EXPECT_NE(epoch_a, Epoch(c));
}

TEST(ShuffledLoaderTest, SkipsTheIncompleteLastBatchOfAnEpoch) {
  const std::vector<int64_t> sizes = {81, 50};  // T = 8: 10 + 6 = 16 windows, B = 3
  DataLoader loader(PositionSource(sizes), Shuffled(3, 8, 5));
  EXPECT_EQ(loader.batches_per_epoch(), 5);
  const auto epoch = Epoch(loader);
  EXPECT_EQ(std::set<Window>(epoch.begin(), epoch.end()).size(), 15u);
  EXPECT_EQ(loader.state(), (LoaderState{1, 0, 0}));
}

TEST(ShuffledLoaderTest, RanksSplitTheSingleProcessBatch) {
  const std::vector<int64_t> sizes = {400, 250, 333};
  const int world = 4;
  DataLoader single(PositionSource(sizes), Shuffled(world * 3, 12, 8));
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(
        std::make_unique<DataLoader>(PositionSource(sizes), Shuffled(3, 12, 8, r, world)));
  }
  EXPECT_EQ(ranks[0]->batches_per_epoch(), single.batches_per_epoch());
  for (int step = 0; step < 2 * single.batches_per_epoch() + 1; ++step) {
    const auto all = NextWindows(single);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(NextWindows(*ranks[r]), Windows(all.begin() + 3 * r, all.begin() + 3 * r + 3));
    }
  }
}

TEST(ShuffledLoaderTest, RestoresASavedState) {
  const std::vector<int64_t> sizes = {300, 301};
  DataLoader a(PositionSource(sizes), Shuffled(2, 10, 3));
  for (int i = 0; i < 40; ++i) a.NextBatch();  // into the second epoch (29 batches each)
  const LoaderState saved = a.state();
  EXPECT_EQ(saved, (LoaderState{1, 0, 22}));
  std::vector<Windows> after;
  for (int i = 0; i < 30; ++i) after.push_back(NextWindows(a));
  DataLoader b(PositionSource(sizes), Shuffled(2, 10, 3));
  b.Restore(saved);
  for (int i = 0; i < 30; ++i) EXPECT_EQ(NextWindows(b), after[i]);
  ExpectErrorWith<ConfigError>([&] { b.Restore({0, 1, 0}); }, {"shard 1"});
  ExpectErrorWith<ConfigError>([&] { b.Restore({0, 0, 58}); }, {"entry 58", "59 windows"});
}

TEST(ShuffledLoaderTest, NeedsOneBatchOfWindows) {
  ExpectErrorWith<ConfigError>([] { DataLoader l(PositionSource({41}), Shuffled(5, 10, 1)); },
                               {"4 windows", "world*B = 5"});
  ExpectErrorWith<ConfigError>(
      [] {
        DataLoader l(PositionSource({41, 10}), Shuffled(1, 10, 1));
      },
      {"'pos1'", "10 tokens", "T+1 = 11"});
}

}  // namespace
}  // namespace ztrain::data
