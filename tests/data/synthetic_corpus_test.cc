#include "data/synthetic_corpus.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "data/token_source.h"
#include "tests/data/data_test_util.h"

namespace ztrain::data {
namespace {

using test_util::ExpectErrorWith;

std::vector<uint16_t> Tokens(const TokenSource& source) {
  const std::span<const uint16_t> tokens = source.shard(0).As<uint16_t>();
  return {tokens.begin(), tokens.end()};
}

TEST(SyntheticCorpusTest, IsDeterministicPerSeedAndStream) {
  const SyntheticChain a(512, 7), b(512, 7), c(512, 8);
  EXPECT_EQ(a.Generate(5000, 0), b.Generate(5000, 0));
  EXPECT_NE(a.Generate(5000, 0), c.Generate(5000, 0));
  EXPECT_NE(a.Generate(5000, 0), a.Generate(5000, 1));
}

TEST(SyntheticCorpusTest, ChainHasTheDocumentedShape) {
  const SyntheticChain chain(512, 1337);
  std::vector<int> class_counts(4);
  for (int a = 0; a < 512; ++a) ++class_counts[chain.Class(static_cast<uint16_t>(a))];
  for (int n : class_counts) EXPECT_NEAR(n, 128, 40);
  for (int b = 0; b < 512; ++b) {
    const auto& s = chain.Successors(static_cast<uint16_t>(b));
    EXPECT_EQ(s[0], (b + 1) % 512);
    EXPECT_EQ(std::set<uint16_t>(s.begin(), s.end()).size(), 4u) << "token " << b;
    for (int a : {0, 17, 511}) {
      double total = 0;
      for (uint16_t next : s)
        total += chain.Probability(static_cast<uint16_t>(a), static_cast<uint16_t>(b), next);
      EXPECT_NEAR(total, 1.0, 1e-12);
    }
  }
  // -(0.6 ln 0.6 + 0.25 ln 0.25 + 0.1 ln 0.1 + 0.05 ln 0.05), well below ln 512 = 6.238.
  EXPECT_NEAR(chain.EntropyRate(), 1.0331141, 1e-6);
}

TEST(SyntheticCorpusTest, GeneratedTextFollowsTheChain) {
  const SyntheticChain chain(512, 1337);
  const std::vector<uint16_t> text = chain.Generate(2'000'000, 0);
  std::vector<int64_t> by_rank(4);  // how often the next token was the k-th likeliest
  double log_loss = 0;
  for (size_t i = 2; i < text.size(); ++i) {
    const double p = chain.Probability(text[i - 2], text[i - 1], text[i]);
    ASSERT_GT(p, 0.0) << "impossible transition at " << i;
    log_loss -= std::log(p);
    for (int k = 0; k < 4; ++k) by_rank[k] += p == kSyntheticProbs[k];
  }
  const double n = static_cast<double>(text.size() - 2);
  // Standard deviations are below 0.0004 for 2M draws.
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(by_rank[k] / n, kSyntheticProbs[k], 0.003) << k;
  EXPECT_NEAR(log_loss / n, chain.EntropyRate(), 0.005);
  std::set<uint16_t> seen(text.begin(), text.end());
  EXPECT_EQ(seen.size(), 512u);
}

// Cross-entropy on `eval` of a bigram model counted on `train` (add-0.01 smoothing).
double BigramLoss(const std::vector<uint16_t>& train, const std::vector<uint16_t>& eval, int v) {
  std::vector<double> counts(static_cast<size_t>(v) * v, 0.01), totals(v, 0.01 * v);
  for (size_t i = 1; i < train.size(); ++i) {
    counts[train[i - 1] * v + train[i]] += 1;
    totals[train[i - 1]] += 1;
  }
  double loss = 0;
  for (size_t i = 1; i < eval.size(); ++i) {
    loss -= std::log(counts[eval[i - 1] * v + eval[i]] / totals[eval[i - 1]]);
  }
  return loss / static_cast<double>(eval.size() - 1);
}

TEST(SyntheticCorpusTest, ValidationSplitIsPredictableFromTrain) {
  SyntheticCorpusOptions options;  // 512 tokens, 2M train, 64K val
  const auto train = MakeSyntheticSource(options, Split::kTrain);
  const auto val = MakeSyntheticSource(options, Split::kVal);
  EXPECT_EQ(train->num_tokens(), 2'000'000);
  EXPECT_EQ(val->num_tokens(), 65'536);
  EXPECT_EQ(train->shard_name(0), "synthetic:train");
  EXPECT_EQ(val->shard_name(0), "synthetic:val");
  const std::vector<uint16_t> train_tokens = Tokens(*train), val_tokens = Tokens(*val);
  EXPECT_NE(std::vector<uint16_t>(train_tokens.begin(), train_tokens.begin() + 65'536), val_tokens);
  // A bigram model counted on train predicts held-out text to below ln 4 = 1.386 nats (it
  // knows the 4 successors; prev1 also hints at prev2's class), but cannot beat the chain's
  // order-2 entropy rate of 1.033; uniform guessing costs ln 512 = 6.238.
  const double loss = BigramLoss(train_tokens, val_tokens, 512);
  EXPECT_GT(loss, SyntheticChain(512, options.seed).EntropyRate());
  EXPECT_LT(loss, 1.4);
}

TEST(SyntheticCorpusTest, IsTheDefaultDataSource) {
  DataConfig config;
  const auto train = OpenDataSource(config, Split::kTrain, 300, 11);
  const auto val = OpenDataSource(config, Split::kVal, 300, 11);
  ASSERT_NE(train, nullptr);
  ASSERT_NE(val, nullptr);
  SyntheticCorpusOptions options;
  options.vocab_size = 300;
  options.seed = 11;
  EXPECT_EQ(Tokens(*train), Tokens(*MakeSyntheticSource(options, Split::kTrain)));
  EXPECT_EQ(Tokens(*val), Tokens(*MakeSyntheticSource(options, Split::kVal)));
  for (uint16_t t : Tokens(*train)) ASSERT_LT(t, 300);

  config.train = "/nonexistent/ztrain_*.bin";
  EXPECT_EQ(OpenDataSource(config, Split::kVal, 300, 11), nullptr);
  ExpectErrorWith<IoError>([&] { OpenDataSource(config, Split::kTrain, 300, 11); },
                           {"/nonexistent/ztrain_*.bin"});
}

TEST(SyntheticCorpusTest, RejectsAVocabularyOutsideUint16) {
  ExpectErrorWith<ConfigError>([] { SyntheticChain chain(70000, 1); }, {"70000", "65536"});
  ExpectErrorWith<ConfigError>([] { SyntheticChain chain(4, 1); }, {"vocab_size"});
}

}  // namespace
}  // namespace ztrain::data
