#pragma once
// Engine internals shared by the engine/engine*.cc files: where each parameter lives and
// the per-layer state (flat buffers, shards, communication in flight). Private to engine/.
#include <chrono>
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "core/tensor.h"
#include "engine/engine_impl.h"
#include "nn/layer.h"
#include "nn/layer_context.h"
#include "offload/optimizer_state_store.h"
#include "offload/param_store.h"
#include "parallel/comm/communicator.h"
#include "parallel/zero/param_table.h"

namespace ztrain {

inline double SecondsBetween(std::chrono::steady_clock::time_point a,
                             std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Micro-batches whose tokens and targets the engine's device can read: copies on a CUDA
// device (owned by `buffers`), the caller's views on the CPU.
struct EngineImpl::StagedBatches {
  std::vector<Buffer> buffers;
  std::vector<nn::MicroBatch> batches;
};

// One micro-batch in flight through the stage: each layer's saved context and output, kept
// from its forward until its backward.
struct EngineImpl::MicroBatchRun {
  std::vector<nn::LayerContext> ctx;
  std::vector<Buffer> outputs;
  std::vector<Tensor> out_views;
  Tensor input;     // the stage's input: the tokens on the first stage
  Buffer received;  // owns a received input activation (later stages)
  // Checkpointed blocks' inputs kept elsewhere until layer i + 1's backward (outputs[i] moved
  // to kept_inputs[i]): in host memory (cpu_checkpointing on a device), or this tp rank's
  // part of it (partition_activations).
  std::vector<Buffer> kept_inputs;
  // Set for a training forward: every layer's context gets it (Note [LoRA dropout]).
  std::optional<nn::LayerContext::Dropout> dropout;
  // False for evaluation: no backward follows, so RunForward drops each layer's context and
  // input as soon as the layer ran.
  bool backward = true;
};

// Note [ZeRO in the engine]
// Each layer has one flat parameter buffer and a mirroring full gradient buffer of `padded`
// elements, a multiple of dp * 16, so the layer splits into dp equal shards of `shard`
// elements; rank r's shard is [r * shard, (r + 1) * shard). Padding is zero and stays zero.
// zero::LayOut decides all of it (Note [ZeRO flat layout], parallel/zero/flat_layout.h).
// The optimizer owns the range `opt_begin` + [0, opt_len): the whole layer at stage 0, the
// rank's shard at stage >= 1; m and v cover only that range. At stage >= 1 the reduced
// gradient of the range lands in `grad_shard` (reduce-scatter) and, at stages 1 and 2, the
// updated range is all-gathered back into the full parameters (at most
// allgather_bucket_size elements in flight). Gradients are pre-scaled by 1/dp through the
// loss weight, so the sum-reduction yields the gradient of the global-batch mean.
//
// Gradient reductions go in buckets: a layer whose gradients are final (its own backward ran;
// tied uses sit in later layers, whose backward came first) joins the pending bucket, which
// is launched once it holds reduce_bucket_size elements or backward reached layer 0. Stage 0
// reduces during the last micro-batch's backward and always overlaps; stages 1-3 wait for
// each bucket at once unless overlap_comm. zero::GradientReducer (Note [Gradient reducer],
// parallel/zero/gradient_reducer.h) does all of this, its stage policy chosen once in
// EngineImpl::SetUpReducer.
//
// Stages 2 and 3 keep no full gradient buffers between micro-batches: a layer's full buffer is
// allocated (zeroed) just before its backward, reduce-scattered in its bucket, added into
// `grad_shard` and freed when the next bucket launches — so at most two buckets' full
// gradients exist (plus those of layers whose weights are tied into later layers, which must
// live through the whole backward).
//
// Stage 3 also keeps only the shard of the parameters (the parameter store holds the
// shard, the fp32 master the optimizer updates). The whole layer exists only while it is gathered
// (zero::ParamGatherer's Whole), as planned by zero::PlanGathers over the step's positions:
// forward 0..n-1 then backward n-1..0 per micro-batch, each layer needing its own buffer and
// those of the layers it ties to. Gathers the plan prefetches run on the communicator while
// earlier layers compute (Note [Parameter gatherer], parallel/zero/param_gatherer.h).
// Note [Offload in the engine]
// offload_optimizer {device: cpu} and offload_param {device: cpu} keep the state in host
// memory, as the CPU backend always does; with pin_memory it comes from the pinned (mlock)
// allocator. offload_param {device: nvme} (stage 3) gives the parameter store no buffers:
// its ParamSwapper holds the shards (the first max_in_cpu elements' worth in memory, the rest in
// a swap file); a gather reads the shard into its own chunk of the gathered buffer and
// all-gathers in place, and the swapper reads the next planned gathers ahead. The optimizer
// step is deferred to the next read of each shard (Note [Deferred optimizer step],
// engine_optimizer.cc).
// offload_optimizer {device: nvme} gives m and v no buffers: the OptimizerSwapper holds
// them in a file as one array over the layers' optimizer ranges in order, and the step runs
// tile by tile (sub_group_size elements), each tile's parameters stepped from that array.
// Every offload mode does the same arithmetic in the same order as no offload, so the
// results are bitwise equal.
struct EngineImpl::LayerState {
  explicit LayerState(const zero::FlatLayout& l) : layout(l) {}
  // The layer's sizes and ranges (padded, shard, opt_begin, opt_len): the parameter table's,
  // which keeps it in place for the engine's life (Note [Parameter table]).
  const zero::FlatLayout& layout;
  // The fp32 parameters (the whole layer; at stage 3 only this rank's shard), their fp32
  // master on the host and their compute-dtype copy live in EngineImpl::held_ (Note [Parameter
  // store], offload/param_store.h); m and v in EngineImpl::moments_ (Note [Optimizer state
  // store], offload/optimizer_state_store.h).
  Buffer grads;
  // CUDA with AdamW on the host (Note [Devices in the engine]): the gradient range's copy in
  // pinned host memory.
  Buffer grad_host;
  // fp32: this rank's reduced gradient range (stages >= 1, and stage 0 when gradients
  // accumulate in 16 bits: then the whole layer, reduced in fp32).
  Buffer grad_shard;
  Tensor Flat(const Buffer& b, int64_t n) const { return b.AsTensor(DType::kF32, {n}); }
  // The reduced fp32 gradients of the optimizer range's layer buffer: `grad_shard` when it
  // exists (its opt_len elements), else the full fp32 `grads` (stage 0).
  Tensor Reduced() const {
    return grad_shard.data() != nullptr ? Flat(grad_shard, layout.opt_len)
                                        : Flat(grads, layout.padded);
  }
};

}  // namespace ztrain
