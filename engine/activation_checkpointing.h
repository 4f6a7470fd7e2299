#pragma once
// Note [Activation checkpointing in the engine]
// activation_checkpointing.blocks (resolved by the config from `enabled`, `number_checkpoints`
// or the list) names transformer blocks (Layer::BlockIndex). The engine keeps every layer's
// output until the next layer's backward anyway (it is that layer's input), so checkpointing a
// block only has to drop what the block's Forward saved (its context: for a GPT-2 block the
// layernorm outputs, qkv, attention output, residual and the 4C MLP activations, about 16 x C
// values per token, against the C of its input). Before the block's backward, Recompute runs
// its Forward again on the same input with the same parameters (at ZeRO stage 3 the ones
// gathered for the backward) into a throwaway output; the ops are deterministic, so the saved
// values, and so the gradients, are bitwise those of a run without checkpointing. The peak
// holds at most one block's internals instead of all of them.
// cpu_checkpointing on a device also moves each checkpointed block's input to host memory
// after the forward and back before the backward (on the CPU backend activations are host
// memory already: nothing to move). partition_activations, as in DeepSpeed, splits the kept
// inputs across the tensor-parallel ranks: a block's input is the same on every tp rank (the
// row-parallel all-reduce and the vocabulary-parallel embedding end replicated), so each rank
// keeps 1/tp of it (the last part zero-padded) and the tp group all-gathers it back before the
// recompute, in the same order on every rank. With tensor_parallel.size 1 there is nothing to
// split.
//
// ActivationCheckpointing decides which of a stage's layers are checkpointed and does the
// three moves; the engine's step executor (Note [One step executor]) calls them on its layer
// loops and owns the buffers (each layer's output, which is the next one's input, and the
// kept inputs).
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/buffer.h"
#include "core/config.h"
#include "kernels/ops.h"
#include "nn/layer.h"
#include "nn/layer_context.h"
#include "parallel/comm/communicator.h"

namespace ztrain {

class ActivationCheckpointing {
 public:
  struct Options {
    std::vector<bool> checkpointed;  // per layer of the stage
    bool offload_inputs = false;     // cpu_checkpointing on a device: inputs wait on the host
    bool partition_inputs = false;   // partition_activations with tp > 1: 1/tp of each input
  };
  // From the config section, the block index of each of the stage's layers (-1: not a block),
  // whether the engine computes on a device, and the tensor-parallel size.
  static Options OptionsFor(const ActivationCheckpointingConfig& config,
                            const std::vector<int>& block_of_layer, bool on_device, int tp_size);
  // `host` is the (pinned) host memory inputs wait in with offload_inputs; `wait` blocks on a
  // collective (the caller times it). None is owned.
  ActivationCheckpointing(Options options, comm::Communicator& tp, kernels::Ops& ops,
                          Allocator& activations, Allocator* host,
                          std::function<void(comm::Work&)> wait);

  bool checkpointed(size_t layer) const { return options_.checkpointed[layer]; }
  // Whether a checkpointed layer's input moves out of the activations (KeepInput).
  bool moves_inputs() const { return options_.offload_inputs || options_.partition_inputs; }
  // The log line: how many layers rerun their forward, and where their inputs wait.
  std::string Describe(const ActivationCheckpointingConfig& config, bool on_device) const;

  // After a checkpointed layer's forward, with moves_inputs(): moves its input `input`
  // (owned by `owner`, which is freed) into `kept` — host memory, or this tp rank's part.
  void KeepInput(const Tensor& input, Buffer& owner, Buffer& kept);
  // Before the layer's backward: brings the kept input back into a new `owner` (`kept` is
  // freed) and returns its view, of `input`'s dtype and shape.
  Tensor RestoreInput(Buffer& kept, const Tensor& input, Buffer& owner);
  // Before a checkpointed layer's backward: its forward again, from `input`, filling `ctx`
  // with what the backward needs (the output goes to a throwaway buffer shaped like `out`).
  void Recompute(nn::Layer& layer, const nn::MicroBatch& mb, const Tensor& input, const Tensor& out,
                 nn::LayerContext& ctx);

 private:
  const Options options_;
  comm::Communicator& tp_;
  kernels::Ops& ops_;
  Allocator& activations_;
  Allocator* host_;
  const std::function<void(comm::Work&)> wait_;
};

}  // namespace ztrain
