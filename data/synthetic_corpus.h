#pragma once
// The built-in synthetic corpus: a learnable order-2 Markov chain (Note [Synthetic corpus]).
//
// Note [Synthetic corpus]: the chain is built from a seed over `vocab_size` tokens (8 to
// 65536). Every token b gets 4 distinct successors S(b)[0..3], with S(b)[0] = (b+1) mod V
// (so the chain is irreducible and every token occurs) and S(b)[1..3] drawn uniformly without
// repetition; every token a gets a class c(a) in {0,1,2,3}. After the context (prev2 = a,
// prev1 = b) the next token is S(b)[k] with probability kSyntheticProbs[(k + c(a)) mod 4].
// A model must thus learn a bigram table (which 4 tokens can follow b) and look one more
// token back (which of them is likely). Every context's distribution is a permutation of
// kSyntheticProbs, so the entropy rate is exactly H(kSyntheticProbs) ≈ 1.030 nats, whatever the
// stationary distribution; a bigram-only model reaches about ln 4 ≈ 1.386; both are far below
// ln V (6.24 for V = 512). Sequences start from two uniform tokens. The chain and the train
// and validation streams use separate seeds derived from `seed` (data/random.h), so the
// corpus is identical on every machine and the validation split is held out.
//
// Immutable after construction; thread safe to read.
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "data/token_source.h"

namespace ztrain::data {

inline constexpr std::array<double, 4> kSyntheticProbs = {0.6, 0.25, 0.1, 0.05};

struct SyntheticCorpusOptions {
  int64_t vocab_size = 512;
  uint64_t seed = 1337;
  int64_t train_tokens = 2'000'000;
  int64_t val_tokens = 65'536;
};

class SyntheticChain {
 public:
  SyntheticChain(int64_t vocab_size, uint64_t seed);

  int64_t vocab_size() const { return static_cast<int64_t>(successors_.size()); }
  const std::array<uint16_t, 4>& Successors(uint16_t prev1) const { return successors_.at(prev1); }
  int Class(uint16_t prev2) const { return classes_.at(prev2); }
  // P(next | prev2, prev1); 0 when next is not a successor of prev1.
  double Probability(uint16_t prev2, uint16_t prev1, uint16_t next) const;
  // The exact entropy rate in nats per token (Note [Synthetic corpus]).
  double EntropyRate() const;
  // `count` tokens of the stream numbered `stream` (0 = train, 1 = validation).
  std::vector<uint16_t> Generate(int64_t count, uint64_t stream) const;

 private:
  uint64_t seed_;
  std::vector<std::array<uint16_t, 4>> successors_;
  std::vector<uint8_t> classes_;
};

// The train or validation split as a one-shard source named "synthetic:train" / "synthetic:val".
std::shared_ptr<const TokenSource> MakeSyntheticSource(const SyntheticCorpusOptions& options,
                                                       Split split);

}  // namespace ztrain::data
