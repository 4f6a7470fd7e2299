#pragma once
// Decoder: a model run one step at a time for generation, with a KV cache.
//
// Note [KV cache]: generation feeds the prompt once (prefill: its T positions in one step) and
// then each new token alone. Every transformer block keeps the keys and values of all
// positions seen so far (nn::KvCache, fp32 [capacity, kv width]); a step computes q, k and v
// for its new positions only (RoPE at their absolute positions: Ops::RopeForward's
// first_position; GPT-2's position table from row first_position), appends k and v, and
// attends over the cache (Ops::AttentionDecode). So a new token costs one position's
// projections and MLP plus attention over the cache, not a forward over the whole sequence:
// its time stays flat with the prompt length, but for the attention's share. The layers'
// Decode (nn/layer.h) runs the same modules as their Forward, in fp32, batch 1.
//
// A Decoder owns its model (BuildModel of `model`, whole linears, no adapters: a LoRA run's
// model is generated from merged weights) and fp32 copies of its parameters, set once by
// `fill`. Runs on the CPU (AttentionDecode). Not thread safe.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/buffer.h"
#include "core/caching_allocator.h"
#include "core/config.h"
#include "core/memory_tracker.h"
#include "kernels/ops.h"
#include "nn/family.h"

namespace ztrain::nn {

class Decoder {
 public:
  // fill(name, destination) writes the whole fp32 value of parameter `name` (every owned
  // parameter of the model, in model order; a tied one is its owner's).
  Decoder(const ModelConfig& model,
          const std::function<void(const std::string& name, const Tensor& out)>& fill);
  ~Decoder();

  // Feeds `tokens` as the next positions of the sequence and returns the logits of the last
  // one (vocab_size entries: the padded rows are left out). ConfigError when the sequence
  // would pass model.max_seq_len.
  std::vector<float> Step(std::span<const int32_t> tokens);
  // Forgets the sequence (empties the caches).
  void Reset();
  // Positions fed so far.
  int64_t length() const { return length_; }
  // Bytes the KV caches hold: model.max_seq_len rows per layer, or the window in a sliding
  // layer (Note [Windowed KV cache]), once the first step allocated them.
  int64_t cache_bytes() const;
  const ModelConfig& model() const { return model_; }

 private:
  ModelConfig model_;
  std::unique_ptr<kernels::Ops> ops_;
  MemoryTracker tracker_;
  HostAllocator host_;
  CachingAllocator cache_;
  LayerList layers_;
  std::vector<Buffer> storage_;  // the parameters
  std::vector<KvCache> kv_;
  int64_t length_ = 0;
};

// How Generate picks each token: greedy (temperature 0), or a sample at `temperature` from
// the top_k most likely (0: all) within the smallest set of probability >= top_p (1: all),
// drawn from a stream seeded by `seed` (data/random.h: the same on every machine).
struct SamplingOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0;
  int64_t top_k = 0;
  double top_p = 1;
  uint64_t seed = 0;
  std::vector<int32_t> stop_tokens;  // generation ends after producing one of these
  // Only ids below this are picked (0: every id of the model). Set to the tokenizer's
  // vocabulary, so that each id has text: a model's embedding may have more rows than its
  // tokenizer has ids (Qwen2: 151,936 rows for 151,665 ids; a run's vocab_size above the
  // tokenizer's), and an untrained model picks those as readily as any other.
  int64_t vocab_limit = 0;
};

// The token Sample picks from `logits` with options `o`, `draw` a uniform number in [0, 1).
int32_t SampleToken(std::span<const float> logits, const SamplingOptions& o, double draw);

// Generates up to o.max_new_tokens after `prompt` (at least one token); calls
// on_token(id) as each comes. Returns the new tokens.
std::vector<int32_t> Generate(Decoder& decoder, std::span<const int32_t> prompt,
                              const SamplingOptions& o,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace ztrain::nn
