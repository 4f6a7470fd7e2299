#include "data/mixture.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/config.h"
#include "core/error.h"
#include "data/random.h"

namespace ztrain::data {

std::vector<WeightedSource> OpenTrainMixture(const DataConfig& config) {
  std::vector<WeightedSource> out;
  for (const DataSourceSpec& d : config.train_mixture) {
    out.push_back({std::make_shared<ShardFileSource>(d.path), d.weight});
  }
  return out;
}

Mixture::Mixture(std::vector<WeightedSource> datasets, int64_t seq_len, bool shuffle,
                 uint64_t seed)
    : datasets_(std::move(datasets)), seq_len_(seq_len), shuffle_(shuffle), seed_(seed) {
  ZTRAIN_CHECK_T(ConfigError, !datasets_.empty(), "a data mixture needs at least one dataset");
  ZTRAIN_CHECK_T(ConfigError, seq_len_ >= 1, "a data mixture needs seq_len >= 1, got ", seq_len_);
  double total = 0;
  for (const WeightedSource& d : datasets_) {
    ZTRAIN_CHECK_T(ConfigError, d.source != nullptr, "a data mixture's dataset has no source");
    ZTRAIN_CHECK_T(ConfigError, std::isfinite(d.weight) && d.weight > 0, "a dataset's weight must "
                   "be a positive number, got ", d.weight, " for '", d.source->shard_name(0), "'");
    total += d.weight;
  }
  for (const WeightedSource& d : datasets_) {
    weights_.push_back(d.weight / total);
    std::vector<int64_t> offsets{0};
    for (int64_t s = 0; s < d.source->num_shards(); ++s) {
      const int64_t size = static_cast<int64_t>(d.source->shard(s).size());
      offsets.push_back(offsets.back() + std::max<int64_t>(0, (size - 1) / seq_len_));
    }
    ZTRAIN_CHECK_T(ConfigError, offsets.back() >= 1, "dataset '", d.source->shard_name(0),
                   "' holds no window of T+1 = ", seq_len_ + 1,
                   " tokens; use a shorter seq_len or more data");
    offsets_.push_back(std::move(offsets));
  }
  Restore(0);
}

int Mixture::Choose() const {
  int best = 0;
  double best_deficit = -1e300;
  const double n = static_cast<double>(consumed_ + 1);
  for (int d = 0; d < num_datasets(); ++d) {
    const double deficit = weights_[d] * n - static_cast<double>(counts_[d]);
    if (deficit > best_deficit) {
      best_deficit = deficit;
      best = d;
    }
  }
  return best;
}

Mixture::Window Mixture::Locate(int d, int64_t k) {
  const int64_t w = windows(d);
  const int64_t epoch = k / w;
  int64_t window = k % w;
  if (shuffle_) {
    auto& current = epochs_[d];
    if (!current || current->first != epoch) {
      const uint64_t key = DeriveSeed(DeriveSeed(seed_, static_cast<uint64_t>(d) + 1),
                                      static_cast<uint64_t>(epoch));
      current.emplace(epoch, WindowPermutation(static_cast<uint64_t>(w), key));
    }
    window = static_cast<int64_t>(current->second(static_cast<uint64_t>(window)));
  }
  const std::vector<int64_t>& offsets = offsets_[d];
  const auto it = std::upper_bound(offsets.begin(), offsets.end(), window);
  const int64_t shard = (it - offsets.begin()) - 1;
  return Window{d, shard, (window - offsets[shard]) * seq_len_};
}

Mixture::Window Mixture::Next() {
  const int d = Choose();
  const int64_t k = counts_[d]++;
  ++consumed_;
  return Locate(d, k);
}

void Mixture::Restore(int64_t n) {
  ZTRAIN_CHECK_T(ConfigError, n >= 0, "cannot restore a data mixture to sample ", n);
  consumed_ = 0;
  counts_.assign(datasets_.size(), 0);
  epochs_.assign(datasets_.size(), std::nullopt);
  for (; consumed_ < n; ++consumed_) ++counts_[Choose()];
}

}  // namespace ztrain::data
