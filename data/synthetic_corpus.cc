#include "data/synthetic_corpus.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "data/random.h"

namespace ztrain::data {
namespace {

constexpr uint64_t kChainStream = 0x636861696eull;   // "chain"
constexpr uint64_t kTextStreamBase = 0x74657874ull;  // "text"

}  // namespace

SyntheticChain::SyntheticChain(int64_t vocab_size, uint64_t seed) : seed_(seed) {
  ZTRAIN_CHECK_T(ConfigError, vocab_size >= 8 && vocab_size <= 65536,
                 "the synthetic corpus needs 8 <= vocab_size <= 65536 (uint16 tokens), got ",
                 vocab_size);
  const uint64_t v = static_cast<uint64_t>(vocab_size);
  Xoshiro256 rng(DeriveSeed(seed, kChainStream));
  successors_.resize(v);
  classes_.resize(v);
  for (uint64_t b = 0; b < v; ++b) {
    std::array<uint16_t, 4>& s = successors_[b];
    s[0] = static_cast<uint16_t>((b + 1) % v);
    for (int k = 1; k < 4; ++k) {
      bool repeated = true;
      while (repeated) {
        s[k] = static_cast<uint16_t>(rng.Below(v));
        repeated = false;
        for (int j = 0; j < k; ++j) repeated |= s[j] == s[k];
      }
    }
  }
  for (uint64_t a = 0; a < v; ++a) classes_[a] = static_cast<uint8_t>(rng.Below(4));
}

double SyntheticChain::Probability(uint16_t prev2, uint16_t prev1, uint16_t next) const {
  const std::array<uint16_t, 4>& s = Successors(prev1);
  for (int k = 0; k < 4; ++k) {
    if (s[k] == next) return kSyntheticProbs[(k + Class(prev2)) % 4];
  }
  return 0.0;
}

double SyntheticChain::EntropyRate() const {
  double h = 0.0;
  for (double p : kSyntheticProbs) h -= p * std::log(p);
  return h;
}

std::vector<uint16_t> SyntheticChain::Generate(int64_t count, uint64_t stream) const {
  ZTRAIN_CHECK_T(ConfigError, count >= 2, "the synthetic corpus needs at least 2 tokens, got ",
                 count);
  Xoshiro256 rng(DeriveSeed(seed_, kTextStreamBase + stream));
  std::vector<uint16_t> out(static_cast<size_t>(count));
  out[0] = static_cast<uint16_t>(rng.Below(successors_.size()));
  out[1] = static_cast<uint16_t>(rng.Below(successors_.size()));
  for (size_t i = 2; i < out.size(); ++i) {
    const int cls = classes_[out[i - 2]];
    const std::array<uint16_t, 4>& s = successors_[out[i - 1]];
    double u = rng.NextDouble();
    // Walk the successors in order, subtracting their probabilities; the last takes the rest.
    int k = 0;
    for (; k < 3; ++k) {
      const double p = kSyntheticProbs[(k + cls) % 4];
      if (u < p) break;
      u -= p;
    }
    out[i] = s[k];
  }
  return out;
}

std::shared_ptr<const TokenSource> MakeSyntheticSource(const SyntheticCorpusOptions& options,
                                                       Split split) {
  const SyntheticChain chain(options.vocab_size, options.seed);
  const bool train = split == Split::kTrain;
  std::vector<std::vector<uint16_t>> shards;
  shards.push_back(
      chain.Generate(train ? options.train_tokens : options.val_tokens, train ? 0 : 1));
  return std::make_shared<InMemoryTokenSource>(
      std::move(shards), std::vector<std::string>{train ? "synthetic:train" : "synthetic:val"});
}

}  // namespace ztrain::data
