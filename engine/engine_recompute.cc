// Activation checkpointing: checkpointed blocks keep only their input and run their forward
// again during backward.
//
// Note [Activation checkpointing in the engine]
// activation_checkpointing.blocks (resolved by the config from `enabled`, `number_checkpoints`
// or the list) names transformer blocks (Layer::BlockIndex). The engine keeps every layer's
// output until the next layer's backward anyway (it is that layer's input), so checkpointing a
// block only has to drop what the block's Forward saved (KeepOnlyInput releases its context:
// for a GPT-2 block the layernorm outputs, qkv, attention output, residual and the 4C MLP
// activations, about 16 x C values per token, against the C of its input). Before the block's
// backward, Recompute runs its Forward again on the same input with the same parameters (at
// ZeRO stage 3 the ones gathered for the backward) into a throwaway output; the ops are
// deterministic, so the saved values, and so the gradients, are bitwise those of a run
// without checkpointing. The peak holds at most one block's internals instead of all of them.
// cpu_checkpointing on a device also moves each checkpointed block's input to host memory
// after the forward and back before the backward (on the CPU backend activations are host
// memory already: nothing to move). partition_activations, as in DeepSpeed, splits the kept
// inputs across the tensor-parallel ranks: a block's input is the same on every tp rank (the
// row-parallel all-reduce and the vocabulary-parallel embedding end replicated), so each rank
// keeps 1/tp of it and the tp group all-gathers it back before the recompute, in the same
// order on every rank. With tensor_parallel.size 1 there is nothing to split.
#include <algorithm>
#include <string>

#include "core/logging.h"
#include "engine/engine.h"
#include "engine/engine_state.h"

namespace ztrain {

void Engine::SetUpCheckpointing() {
  const ActivationCheckpointingConfig& ac = config_.activation_checkpointing;
  checkpointed_.assign(layers_.size(), false);
  if (!ac.enabled) return;
  int count = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int block = layers_[i]->BlockIndex();
    if (block < 0) continue;
    for (const int b : ac.blocks) checkpointed_[i] = checkpointed_[i] || b == block;
    count += checkpointed_[i] ? 1 : 0;
  }
  offload_checkpoints_ = ac.cpu_checkpointing && on_device();
  partition_checkpoints_ = ac.partition_activations && tp_->size() > 1;
  const std::string where = !ac.cpu_checkpointing ? ""
                            : on_device()
                                ? "; their inputs wait in host memory"
                                : "; cpu_checkpointing: activations are host memory on the CPU "
                                  "backend already";
  const std::string parts =
      partition_checkpoints_
          ? fmt::format("; their inputs partitioned over the {} tensor-parallel ranks", tp_->size())
          : "";
  if (!computes_) return;
  Log().info(
      "activation checkpointing: {} of this stage's layers rerun their forward in "
      "backward{}{}",
      count, where, parts);
}

void Engine::KeepOnlyInput(size_t i, MicroBatchRun& run) {
  run.ctx[i].Release();
  if (i == 0 || (!offload_checkpoints_ && !partition_checkpoints_)) return;
  const Tensor view = run.out_views[i - 1];
  if (run.kept_inputs.size() < i) run.kept_inputs.resize(i);
  Buffer& kept = run.kept_inputs[i - 1];
  if (partition_checkpoints_) {  // this rank's 1/tp of it, the last part zero-padded
    const int64_t n = view.numel(), t = tp_->size(), chunk = (n + t - 1) / t;
    const int64_t begin = std::min(n, tp_->rank() * chunk), count = std::min(chunk, n - begin);
    kept = Buffer(activations_, view.dtype(), {chunk}, MemoryCategory::kActivations);
    ZeroFill(kept);
    ops_->Copy(view.Flat(begin, {count}), kept.AsTensor(view.dtype(), {count}));
  } else {
    kept = Buffer(*cuda_pinned_, view.dtype(), view.shape(), MemoryCategory::kActivations);
    ops_->Copy(view, kept.AsTensor(view.dtype(), view.shape()));
  }
  ops_->Synchronize();  // before the buffer goes back to the pool
  run.outputs[i - 1].Reset();
}

void Engine::RestoreInput(size_t i, MicroBatchRun& run) {
  Buffer& kept = run.kept_inputs[i - 1];
  const Tensor view = run.out_views[i - 1];
  if (partition_checkpoints_) {
    const auto chunk = static_cast<int64_t>(kept.nbytes() / DTypeSize(view.dtype()));
    const int64_t t = tp_->size();
    run.outputs[i - 1] =
        Buffer(activations_, view.dtype(), {chunk * t}, MemoryCategory::kActivations);
    WaitFor(*tp_->AllGather(kept.AsTensor(view.dtype(), {chunk}),
                            run.outputs[i - 1].AsTensor(view.dtype(), {chunk * t})));
  } else {
    run.outputs[i - 1] =
        Buffer(activations_, view.dtype(), view.shape(), MemoryCategory::kActivations);
    ops_->Copy(kept.AsTensor(view.dtype(), view.shape()),
               run.outputs[i - 1].AsTensor(view.dtype(), view.shape()));
    ops_->Synchronize();
  }
  run.out_views[i - 1] = run.outputs[i - 1].AsTensor(view.dtype(), view.shape());
  kept.Reset();
}

void Engine::Recompute(const nn::MicroBatch& mb, size_t i, MicroBatchRun& run) {
  const Tensor& out = run.out_views[i];
  Buffer scratch(activations_, out.dtype(), out.shape(), MemoryCategory::kActivations);
  const Tensor input = i == 0 ? run.input : run.out_views[i - 1];
  layers_[i]->Forward(mb, input, scratch.AsTensor(out.dtype(), out.shape()), run.ctx[i]);
}

}  // namespace ztrain
