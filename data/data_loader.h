#pragma once
// DataLoader: batches of B windows of T+1 tokens, as int32 tokens and targets of shape [B, T].
//
// tokens[b][t] = window_b[t] and targets[b][t] = window_b[t+1]. The loader reads a shared,
// immutable TokenSource and owns two small host output buffers (B*T int32 each); it is not
// thread safe (one loader per thread). Construction fails with ConfigError when the options
// are invalid or a shard is too small for one batch, and with IoError when any token of the
// source is >= vocab_size (TokenSource::CheckVocabulary: the whole source is checked once, when
// the loader opens it, so a bad token deep in a shard cannot end a run at step N). Shards may
// store uint16 or uint32 tokens, mixed in one source: the batches depend only on the token
// ids, never on how wide they were stored (vocab_size is at most 2^31, so every id fits int32).
//
// Note [Sequential order] (shuffle off): exactly llm.c's DataLoader (llmc/dataloader.h), so a
// run can be compared token for token with llm.c. A global batch of G = world*B*T tokens
// starts at position p of the current shard; rank r reads the B*T+1 consecutive tokens from
// p + r*B*T, and p advances by G. When the next global batch would run past the shard's end
// (p + G + 1 > shard size) the loader moves to position 0 of the next shard, wrapping from the
// last shard to the first (a new epoch). Every shard must hold at least G+1 tokens. Rank r of
// world R thus reads its slice of the same global sequence that a single process with
// batch R*B would read.
//
// Note [Shuffle order] (shuffle on): the source is cut into windows of T+1 tokens with stride
// T — shard s holds (size_s - 1) / T of them, at positions 0, T, 2T, ... — and numbered
// globally in shard order (W in all). Epoch e visits them in the order
// WindowPermutation(W, DeriveSeed(seed, e)) (data/window_permutation.h, data/random.h): entry i
// of the epoch is window perm(i). A global batch takes the next world*B entries; rank r takes
// entries r*B .. r*B+B-1 of it. An epoch ends when fewer than world*B entries remain (the rest
// are skipped). The order depends only on (seed, epoch, world*B), never on the machine.
//
// Note [Data mixture] (data/mixture.h) is the third order, for several weighted datasets: the
// global sample sequence is the Mixture's, and a global batch takes its next world*B samples
// (rank r: r*B .. r*B+B-1); LoaderState.position counts the samples taken.
//
// In all orders the global sample sequence depends on world*B, not on how it splits into
// ranks: rank r of R with batch B reads what rows r*B..r*B+B-1 of a single process with
// batch R*B would read (DESIGN.md, the equivalence rule). Micro-batches of gradient
// accumulation read consecutive global batches, so they too see the same windows as one
// larger batch, except near a shard's end (sequential) or an epoch's end (shuffled), where
// layouts with a different world*B skip a different tail.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "data/mixture.h"
#include "data/token_source.h"
#include "data/window_permutation.h"

namespace ztrain::data {

struct LoaderOptions {
  int64_t batch_size = 0;  // B: windows per batch on this rank (the micro-batch)
  int64_t seq_len = 0;     // T
  int rank = 0;            // data-parallel rank, 0 <= rank < world
  int world = 1;           // data-parallel size
  bool shuffle = false;
  uint64_t seed = 0;           // shuffle order (Note [Shuffle order])
  int64_t vocab_size = 65536;  // every token read must be < vocab_size
};

// Where the next global batch starts; the same on every rank. Saved in checkpoints.
// Sequential: shard index and token position in it (llm.c's current_sample_idx is
// position / (world*B*T); the state moves to the next shard as soon as the current one is
// used up, where llm.c moves at the next read). Shuffled: shard is 0 and position is the
// index of the next entry in the epoch's permuted window order.
// Mixture (Note [Data mixture]): epoch and shard are 0, position counts the global samples
// taken, and `mixture` is set.
struct LoaderState {
  int64_t epoch = 0;
  int64_t shard = 0;
  int64_t position = 0;
  bool mixture = false;
  bool operator==(const LoaderState&) const = default;
};

// Views of the loader's buffers, valid until the next NextBatch or the loader's destruction.
struct Batch {
  Tensor tokens;   // int32 [B, T]
  Tensor targets;  // int32 [B, T]
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const TokenSource> source, const LoaderOptions& options);
  // A mixture of datasets (Note [Data mixture]); options.shuffle and seed order each one.
  DataLoader(std::vector<WeightedSource> datasets, const LoaderOptions& options);

  // Reads the next batch into the loader's buffers.
  Batch NextBatch();
  // Reads the next batch into caller memory: int32 [B, T] host tensors / B*T int32 each.
  void NextBatch(const Tensor& tokens, const Tensor& targets);
  void NextBatch(int32_t* tokens, int32_t* targets);

  // Back to the first batch of epoch 0.
  void Reset() { Restore(LoaderState{.mixture = mixture_.has_value()}); }
  const LoaderState& state() const { return state_; }
  // Continues from a saved state; ConfigError when it does not fit this source and batch.
  void Restore(const LoaderState& state);

  // Batches each rank reads per epoch (the same on every rank).
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // Windows of T+1 tokens with stride T in the source (the shuffled epoch's length).
  int64_t num_windows() const { return window_offsets_.back(); }
  const LoaderOptions& options() const { return options_; }
  // Tokens in the data (every dataset of a mixture).
  int64_t num_tokens() const;
  // The mixture, or nullptr for one source.
  const Mixture* mixture() const { return mixture_ ? &*mixture_ : nullptr; }

 private:
  void CheckOptions() const;
  void CheckShardSizes() const;
  void NextSequential(int32_t* tokens, int32_t* targets);
  void NextShuffled(int32_t* tokens, int32_t* targets);
  void NextMixed(int32_t* tokens, int32_t* targets);
  // Copies `rows` windows starting at `begin` of `shard` into rows of tokens/targets.
  void CopyWindows(int64_t shard, int64_t begin, int64_t rows, int32_t* tokens,
                   int32_t* targets) const;
  void CopyWindows(const TokenSource& source, int64_t shard, int64_t begin, int64_t rows,
                   int32_t* tokens, int32_t* targets) const;
  void StartEpoch(int64_t epoch);

  std::shared_ptr<const TokenSource> source_;
  LoaderOptions options_;
  int64_t global_tokens_ = 0;            // world*B*T: tokens one sequential global batch advances
  int64_t global_windows_ = 0;           // world*B: entries one shuffled global batch takes
  std::vector<int64_t> window_offsets_;  // first global window number of each shard, then W
  int64_t batches_per_epoch_ = 0;
  LoaderState state_;
  std::optional<WindowPermutation> permutation_;  // the current epoch's order (shuffle)
  std::optional<Mixture> mixture_;                // several datasets (source_ is null)
  std::vector<int32_t> tokens_;
  std::vector<int32_t> targets_;
};

}  // namespace ztrain::data
