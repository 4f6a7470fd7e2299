#pragma once
// Mixture: the sample order of a weighted blend of datasets (data.train as a list of
// {"path", "weight"}).
//
// Note [Data mixture]: global sample n (counted over the whole run, before it is split into
// ranks) comes from the dataset d that maximises weight_d * (n + 1) - count_d, the samples
// d gave before n (ties: the first listed), as Megatron-LM's blended datasets choose
// (build_blending_indices). Every prefix of the run then holds each dataset's share to within
// one sample, not only on average. Within a dataset, its k-th sample is the window of T+1
// tokens (stride T, as Note [Shuffle order] cuts them) numbered k mod W_d in epoch k / W_d:
// in order without shuffle, through WindowPermutation(W_d, DeriveSeed(seed, d, epoch)) with
// it. A dataset that runs out starts its next epoch alone; the others go on. The order is a
// function of (weights, window counts, seed, shuffle) only: every layout reads the same global
// sequence, and a resume replays the choices of the samples already read (O(n) integer work:
// about 10^8 samples a second) to continue mid-mixture.
//
// A Mixture is a value; not thread safe.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/token_source.h"
#include "data/window_permutation.h"

namespace ztrain::data {

struct WeightedSource {
  std::shared_ptr<const TokenSource> source;
  double weight = 1;
};

// The datasets of data.train as a list (DataConfig::train_mixture), each glob opened.
std::vector<WeightedSource> OpenTrainMixture(const DataConfig& config);

class Mixture {
 public:
  // The window of a sample: shard of its dataset and the offset of its first token.
  struct Window {
    int dataset = 0;
    int64_t shard = 0;
    int64_t begin = 0;
  };

  // ConfigError for no datasets, a weight that is not positive and finite, or a dataset
  // without one window of seq_len + 1 tokens.
  Mixture(std::vector<WeightedSource> datasets, int64_t seq_len, bool shuffle, uint64_t seed);

  // The window of sample consumed(), which advances by one.
  Window Next();
  // Samples taken so far (the loader's saved position).
  int64_t consumed() const { return consumed_; }
  // Back to sample `n`, as if Next had been called n times from the start.
  void Restore(int64_t n);

  int num_datasets() const { return static_cast<int>(datasets_.size()); }
  const TokenSource& source(int d) const { return *datasets_[d].source; }
  // Samples dataset d gave so far.
  int64_t count(int d) const { return counts_[d]; }
  // Windows of T+1 tokens in dataset d.
  int64_t windows(int d) const { return offsets_[d].back(); }

 private:
  int Choose() const;
  Window Locate(int d, int64_t k);

  std::vector<WeightedSource> datasets_;
  std::vector<double> weights_;                // normalised to sum 1
  std::vector<std::vector<int64_t>> offsets_;  // per dataset: first window of each shard, then W
  int64_t seq_len_;
  bool shuffle_;
  uint64_t seed_;
  int64_t consumed_ = 0;
  std::vector<int64_t> counts_;
  // The permutation of the epoch each dataset is in (shuffle), made when it starts.
  std::vector<std::optional<std::pair<int64_t, WindowPermutation>>> epochs_;
};

}  // namespace ztrain::data
