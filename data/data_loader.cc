#include "data/data_loader.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "data/random.h"

namespace ztrain::data {
namespace {

// Every id of the vocabulary fits the int32 tokens the loader writes.
constexpr int64_t kMaxVocabulary = int64_t{1} << 31;

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const TokenSource> source, const LoaderOptions& options)
    : source_(std::move(source)), options_(options) {
  ZTRAIN_CHECK_T(ConfigError, source_ != nullptr, "DataLoader needs a token source");
  CheckOptions();
  const int64_t b = options_.batch_size, t = options_.seq_len;
  global_tokens_ = options_.world * b * t;
  global_windows_ = options_.world * b;
  window_offsets_.assign(1, 0);
  for (int64_t s = 0; s < source_->num_shards(); ++s) {
    const int64_t size = static_cast<int64_t>(source_->shard(s).size());
    window_offsets_.push_back(window_offsets_.back() + (size - 1) / t);
  }
  CheckShardSizes();
  source_->CheckVocabulary(options_.vocab_size);
  if (options_.shuffle) {
    batches_per_epoch_ = num_windows() / global_windows_;
  } else {
    for (int64_t s = 0; s < source_->num_shards(); ++s) {
      batches_per_epoch_ += (static_cast<int64_t>(source_->shard(s).size()) - 1) / global_tokens_;
    }
  }
  tokens_.resize(static_cast<size_t>(b * t));
  targets_.resize(static_cast<size_t>(b * t));
  Reset();
}

DataLoader::DataLoader(std::vector<WeightedSource> datasets, const LoaderOptions& options)
    : options_(options) {
  CheckOptions();
  for (const WeightedSource& d : datasets) {
    ZTRAIN_CHECK_T(ConfigError, d.source != nullptr, "DataLoader needs a token source");
    d.source->CheckVocabulary(options_.vocab_size);
  }
  mixture_.emplace(std::move(datasets), options_.seq_len, options_.shuffle, options_.seed);
  global_windows_ = options_.world * options_.batch_size;
  int64_t windows = 0;
  for (int d = 0; d < mixture_->num_datasets(); ++d) windows += mixture_->windows(d);
  window_offsets_ = {0, windows};
  batches_per_epoch_ = std::max<int64_t>(1, windows / global_windows_);
  tokens_.resize(static_cast<size_t>(options_.batch_size * options_.seq_len));
  targets_.resize(static_cast<size_t>(options_.batch_size * options_.seq_len));
  Reset();
}

int64_t DataLoader::num_tokens() const {
  if (!mixture_) return source_->num_tokens();
  int64_t tokens = 0;
  for (int d = 0; d < mixture_->num_datasets(); ++d) tokens += mixture_->source(d).num_tokens();
  return tokens;
}

void DataLoader::CheckOptions() const {
  const LoaderOptions& o = options_;
  ZTRAIN_CHECK_T(ConfigError, o.batch_size >= 1 && o.seq_len >= 1,
                 "DataLoader needs batch_size >= 1 and seq_len >= 1, got B=", o.batch_size,
                 " T=", o.seq_len);
  ZTRAIN_CHECK_T(ConfigError, o.world >= 1 && o.rank >= 0 && o.rank < o.world, "DataLoader rank ",
                 o.rank, " is outside a world of ", o.world);
  ZTRAIN_CHECK_T(ConfigError, o.vocab_size >= 1 && o.vocab_size <= kMaxVocabulary,
                 "DataLoader needs vocab_size in [1, 2^31] (tokens are int32), got ", o.vocab_size);
}

void DataLoader::CheckShardSizes() const {
  const LoaderOptions& o = options_;
  for (int64_t s = 0; s < source_->num_shards(); ++s) {
    const int64_t size = static_cast<int64_t>(source_->shard(s).size());
    if (o.shuffle) {
      ZTRAIN_CHECK_T(ConfigError, size >= o.seq_len + 1, "token shard '", source_->shard_name(s),
                     "' holds ", size, " tokens, fewer than the T+1 = ", o.seq_len + 1,
                     " of one window; use a shorter seq_len or larger shards");
    } else {
      ZTRAIN_CHECK_T(ConfigError, size >= global_tokens_ + 1, "token shard '",
                     source_->shard_name(s), "' holds ", size, " tokens, fewer than the ",
                     o.world > 1 ? "world*B*T+1" : "B*T+1", " = ", global_tokens_ + 1,
                     " that one batch reads (B=", o.batch_size, ", T=", o.seq_len,
                     o.world > 1 ? ", world=" : "", o.world > 1 ? std::to_string(o.world) : "",
                     "); lower the micro-batch size or seq_len, or use larger shards");
    }
  }
  if (o.shuffle) {
    ZTRAIN_CHECK_T(ConfigError, num_windows() >= global_windows_, "the data holds ", num_windows(),
                   " windows of T+1 = ", o.seq_len + 1,
                   " tokens, fewer than the world*B = ", global_windows_, " of one batch");
  }
}

Batch DataLoader::NextBatch() {
  NextBatch(tokens_.data(), targets_.data());
  const Shape shape = {options_.batch_size, options_.seq_len};
  return {Tensor(tokens_.data(), DType::kI32, shape), Tensor(targets_.data(), DType::kI32, shape)};
}

void DataLoader::NextBatch(const Tensor& tokens, const Tensor& targets) {
  const Shape shape = {options_.batch_size, options_.seq_len};
  CheckTensor(tokens, DType::kI32, shape, "DataLoader tokens");
  CheckTensor(targets, DType::kI32, shape, "DataLoader targets");
  ZTRAIN_CHECK(tokens.device().is_cpu() && targets.device().is_cpu(),
               "DataLoader writes host memory; got tokens on ", tokens.device().ToString(),
               " and targets on ", targets.device().ToString());
  NextBatch(tokens.data<int32_t>(), targets.data<int32_t>());
}

void DataLoader::NextBatch(int32_t* tokens, int32_t* targets) {
  if (mixture_) {
    NextMixed(tokens, targets);
  } else if (options_.shuffle) {
    NextShuffled(tokens, targets);
  } else {
    NextSequential(tokens, targets);
  }
}

void DataLoader::NextSequential(int32_t* tokens, int32_t* targets) {
  const int64_t local = options_.batch_size * options_.seq_len;
  CopyWindows(state_.shard, state_.position + options_.rank * local, options_.batch_size, tokens,
              targets);
  // Advance as llm.c does, but eagerly, so the state always names the next batch to read.
  state_.position += global_tokens_;
  const int64_t size = static_cast<int64_t>(source_->shard(state_.shard).size());
  if (state_.position + global_tokens_ + 1 > size) {
    state_.position = 0;
    if (++state_.shard == source_->num_shards()) {
      state_.shard = 0;
      ++state_.epoch;
    }
  }
}

void DataLoader::NextShuffled(int32_t* tokens, int32_t* targets) {
  const int64_t t = options_.seq_len;
  const int64_t first = state_.position + options_.rank * options_.batch_size;
  for (int64_t b = 0; b < options_.batch_size; ++b) {
    const int64_t window = static_cast<int64_t>((*permutation_)(static_cast<uint64_t>(first + b)));
    const auto it = std::upper_bound(window_offsets_.begin(), window_offsets_.end(), window);
    const int64_t shard = (it - window_offsets_.begin()) - 1;
    CopyWindows(shard, (window - window_offsets_[shard]) * t, 1, tokens + b * t, targets + b * t);
  }
  state_.position += global_windows_;
  if (state_.position + global_windows_ > num_windows()) StartEpoch(state_.epoch + 1);
}

// Every rank walks the whole global batch (the choices depend on all samples before) and
// copies its own rows.
void DataLoader::NextMixed(int32_t* tokens, int32_t* targets) {
  const int64_t t = options_.seq_len, first = options_.rank * options_.batch_size;
  for (int64_t row = 0; row < global_windows_; ++row) {
    const Mixture::Window w = mixture_->Next();
    if (row < first || row >= first + options_.batch_size) continue;
    const int64_t b = row - first;
    CopyWindows(mixture_->source(w.dataset), w.shard, w.begin, 1, tokens + b * t, targets + b * t);
  }
  state_ = LoaderState{0, 0, mixture_->consumed(), true};
}

void DataLoader::CopyWindows(int64_t shard, int64_t begin, int64_t rows, int32_t* tokens,
                             int32_t* targets) const {
  CopyWindows(*source_, shard, begin, rows, tokens, targets);
}

void DataLoader::CopyWindows(const TokenSource& source, int64_t shard, int64_t begin,
                             int64_t rows, int32_t* tokens, int32_t* targets) const {
  const int64_t count = rows * options_.seq_len;
  source.shard(shard).Visit([&](auto shard_tokens) {
    const auto* src = shard_tokens.data() + begin;
    for (int64_t i = 0; i < count; ++i) {
      tokens[i] = static_cast<int32_t>(src[i]);  // < vocab_size <= 2^31 (CheckOptions)
      targets[i] = static_cast<int32_t>(src[i + 1]);
    }
  });
}

void DataLoader::StartEpoch(int64_t epoch) {
  state_ = LoaderState{epoch, 0, 0};
  if (mixture_) {
    mixture_->Restore(0);
    return;
  }
  if (options_.shuffle) {
    permutation_.emplace(static_cast<uint64_t>(num_windows()),
                         DeriveSeed(options_.seed, static_cast<uint64_t>(epoch)));
  }
}

void DataLoader::Restore(const LoaderState& state) {
  ZTRAIN_CHECK_T(ConfigError, state.mixture == mixture_.has_value(),
                 "cannot continue the data order: it was saved reading ",
                 state.mixture ? "a mixture of datasets" : "one glob", " and this run reads ",
                 mixture_ ? "a mixture (data.train is a list)" : "one glob",
                 "; keep data.train as it was, or start a new checkpoint.dir");
  if (mixture_) {
    ZTRAIN_CHECK_T(ConfigError, state.epoch == 0 && state.shard == 0 && state.position >= 0,
                   "cannot restore a data mixture to epoch ", state.epoch, ", shard ", state.shard,
                   ", sample ", state.position);
    mixture_->Restore(state.position);
    state_ = state;
    return;
  }
  const char* hint = ": was it saved with other data, batch size, seq_len or world size?";
  ZTRAIN_CHECK_T(ConfigError, state.epoch >= 0, "cannot restore a loader to epoch ", state.epoch);
  if (options_.shuffle) {
    ZTRAIN_CHECK_T(ConfigError,
                   state.shard == 0 && state.position >= 0 &&
                       state.position + global_windows_ <= num_windows(),
                   "cannot restore the shuffled loader to shard ", state.shard, ", entry ",
                   state.position, " of ", num_windows(), " windows (batch takes ", global_windows_,
                   ")", hint);
  } else {
    const bool shard_ok = state.shard >= 0 && state.shard < source_->num_shards();
    const int64_t size = shard_ok ? static_cast<int64_t>(source_->shard(state.shard).size()) : 0;
    ZTRAIN_CHECK_T(
        ConfigError, shard_ok && state.position >= 0 && state.position + global_tokens_ + 1 <= size,
        "cannot restore the loader to shard ", state.shard, " of ", source_->num_shards(),
        ", position ", state.position, " (a batch reads ", global_tokens_ + 1, " tokens)", hint);
  }
  StartEpoch(state.epoch);
  state_ = state;
}

}  // namespace ztrain::data
