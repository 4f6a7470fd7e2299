// data/mixture.h and the DataLoader's mixture order (Note [Data mixture]): shares of every
// prefix within one sample of the weights, token fractions within 1% over 10k samples, each
// dataset's windows once per epoch, the equivalence rule across ranks, and resume mid-mixture.
#include "data/mixture.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/data_loader.h"
#include "tests/data/data_test_util.h"

namespace ztrain::data {
namespace {

using test_util::ExpectErrorWith;

// Dataset d: `shards` shards of `tokens` tokens each, every token in [100 d, 100 d + 99], so a
// token names its dataset.
std::shared_ptr<const TokenSource> Dataset(int d, int shards, int tokens) {
  std::vector<std::vector<uint16_t>> data;
  std::vector<std::string> names;
  for (int s = 0; s < shards; ++s) {
    std::vector<uint16_t> t;
    for (int i = 0; i < tokens; ++i) t.push_back(static_cast<uint16_t>(100 * d + (i * 7 + s) % 100));
    data.push_back(t);
    names.push_back("d" + std::to_string(d) + "s" + std::to_string(s));
  }
  return std::make_shared<InMemoryTokenSource>(std::move(data), std::move(names));
}

std::vector<WeightedSource> ThreeDatasets() {
  return {{Dataset(0, 2, 200), 5}, {Dataset(1, 1, 97), 3}, {Dataset(2, 3, 50), 2}};
}

TEST(MixtureTest, EveryPrefixHoldsEachShareToWithinOneSample) {
  Mixture m(ThreeDatasets(), 8, true, 7);
  const double w[3] = {0.5, 0.3, 0.2};
  for (int n = 1; n <= 10000; ++n) {
    m.Next();
    for (int d = 0; d < 3; ++d) {
      ASSERT_LE(std::fabs(static_cast<double>(m.count(d)) - w[d] * n), 1.0) << n << " " << d;
    }
  }
}

TEST(MixtureTest, EachDatasetVisitsEveryWindowOncePerEpoch) {
  for (const bool shuffle : {false, true}) {
    Mixture m(ThreeDatasets(), 8, shuffle, 7);
    const int64_t w1 = m.windows(1);  // (97 - 1) / 8 = 12
    ASSERT_EQ(w1, 12);
    std::vector<int64_t> order;
    while (m.count(1) < 3 * w1) {
      const Mixture::Window w = m.Next();
      if (w.dataset == 1) order.push_back(w.begin / 8);
    }
    for (int e = 0; e < 3; ++e) {
      const std::set<int64_t> epoch(order.begin() + e * w1, order.begin() + (e + 1) * w1);
      EXPECT_EQ(epoch.size(), static_cast<size_t>(w1)) << "epoch " << e;
    }
    const std::vector<int64_t> first(order.begin(), order.begin() + w1);
    const std::vector<int64_t> second(order.begin() + w1, order.begin() + 2 * w1);
    if (shuffle) {
      EXPECT_NE(first, second);  // a new permutation each epoch
    } else {
      for (int64_t i = 0; i < w1; ++i) EXPECT_EQ(first[i], i);
      EXPECT_EQ(first, second);
    }
  }
}

TEST(MixtureTest, RefusesBadWeightsAndDatasetsWithoutAWindow) {
  ExpectErrorWith<ConfigError>([] { Mixture({{Dataset(0, 1, 50), 0}}, 8, false, 1); },
                               {"weight must be a positive number", "d0s0"});
  ExpectErrorWith<ConfigError>([] { Mixture({{Dataset(0, 1, 8), 1}}, 8, false, 1); },
                               {"no window of T+1 = 9 tokens"});
  ExpectErrorWith<ConfigError>([] { Mixture({}, 8, false, 1); }, {"at least one dataset"});
}

LoaderOptions Options(int64_t b, int rank, int world, bool shuffle) {
  LoaderOptions o;
  o.batch_size = b;
  o.seq_len = 8;
  o.rank = rank;
  o.world = world;
  o.shuffle = shuffle;
  o.seed = 11;
  o.vocab_size = 300;
  return o;
}

TEST(MixtureLoaderTest, TokenFractionsFollowTheWeights) {
  DataLoader loader(ThreeDatasets(), Options(10, 0, 1, true));
  int64_t per_dataset[3] = {0, 0, 0}, total = 0;
  for (int step = 0; step < 1000; ++step) {  // 10k samples
    const Batch batch = loader.NextBatch();
    const int32_t* t = batch.tokens.data<int32_t>();
    for (int64_t i = 0; i < 10 * 8; ++i) ++per_dataset[t[i] / 100];
    total += 10 * 8;
  }
  const double w[3] = {0.5, 0.3, 0.2};
  for (int d = 0; d < 3; ++d) {
    EXPECT_NEAR(static_cast<double>(per_dataset[d]) / static_cast<double>(total), w[d], 0.01) << d;
  }
}

// Rank r of world R with batch B reads rows r*B .. r*B+B-1 of one process's batch R*B.
TEST(MixtureLoaderTest, RanksReadTheirRowsOfTheSingleProcessBatch) {
  for (const bool shuffle : {false, true}) {
    DataLoader single(ThreeDatasets(), Options(6, 0, 1, shuffle));
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < 3; ++r) {
      ranks.push_back(std::make_unique<DataLoader>(ThreeDatasets(), Options(2, r, 3, shuffle)));
    }
    for (int step = 0; step < 40; ++step) {
      const Batch all = single.NextBatch();
      for (int r = 0; r < 3; ++r) {
        const Batch mine = ranks[r]->NextBatch();
        for (int64_t i = 0; i < 2 * 8; ++i) {
          ASSERT_EQ(mine.tokens.data<int32_t>()[i], all.tokens.data<int32_t>()[r * 16 + i]);
          ASSERT_EQ(mine.targets.data<int32_t>()[i], all.targets.data<int32_t>()[r * 16 + i]);
        }
      }
    }
    EXPECT_EQ(single.state().position, 240);
  }
}

TEST(MixtureLoaderTest, ResumeContinuesMidMixture) {
  DataLoader a(ThreeDatasets(), Options(4, 0, 1, true));
  for (int step = 0; step < 37; ++step) a.NextBatch();
  const LoaderState saved = a.state();
  EXPECT_TRUE(saved.mixture);
  DataLoader b(ThreeDatasets(), Options(4, 0, 1, true));
  b.Restore(saved);
  for (int step = 0; step < 50; ++step) {
    const Batch x = a.NextBatch();
    const Batch y = b.NextBatch();
    for (int64_t i = 0; i < 4 * 8; ++i) {
      ASSERT_EQ(x.tokens.data<int32_t>()[i], y.tokens.data<int32_t>()[i]) << step;
    }
  }
  // A position saved by a one-glob loader is not a mixture's, nor the other way.
  DataLoader glob(Dataset(0, 2, 200), Options(4, 0, 1, true));
  ExpectErrorWith<ConfigError>([&] { glob.Restore(saved); },
                               {"saved reading a mixture", "this run reads one glob"});
  ExpectErrorWith<ConfigError>([&] { b.Restore(LoaderState{0, 0, 8, false}); },
                               {"saved reading one glob", "this run reads a mixture"});
}

}  // namespace
}  // namespace ztrain::data
