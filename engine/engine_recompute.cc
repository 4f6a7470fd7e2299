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
// memory already: nothing to move). partition_activations splits checkpoints across
// tensor-parallel ranks in DeepSpeed; with tensor_parallel.size 1 there is nothing to split,
// and with tensor parallelism it is not built yet (refused).
#include "core/logging.h"
#include "engine/engine.h"
#include "engine/engine_state.h"

namespace ztrain {

void Engine::SetUpCheckpointing() {
  const ActivationCheckpointingConfig& ac = config_.activation_checkpointing;
  checkpointed_.assign(layers_.size(), false);
  if (!ac.enabled) return;
  ZTRAIN_CHECK_T(ConfigError, !ac.partition_activations || tp_->size() == 1,
                 "activation_checkpointing.partition_activations with tensor_parallel.size ",
                 tp_->size(),
                 " is not built yet; set it to false (checkpoints then stay whole "
                 "on every tensor-parallel rank)");
  int count = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int block = layers_[i]->BlockIndex();
    if (block < 0) continue;
    for (const int b : ac.blocks) checkpointed_[i] = checkpointed_[i] || b == block;
    count += checkpointed_[i] ? 1 : 0;
  }
  offload_checkpoints_ = ac.cpu_checkpointing && on_device();
  Log().info(
      "activation checkpointing: {} of this stage's layers rerun their forward in "
      "backward{}",
      count,
      ac.cpu_checkpointing ? (on_device() ? "; their inputs wait in host memory"
                                          : "; cpu_checkpointing: activations are host "
                                            "memory on the CPU backend already")
                           : "");
}

void Engine::KeepOnlyInput(size_t i, MicroBatchRun& run) {
  run.ctx[i].Release();
  if (!offload_checkpoints_ || i == 0) return;
  Buffer& input = run.outputs[i - 1];
  const Tensor view = run.out_views[i - 1];
  if (run.host_inputs.size() < i) run.host_inputs.resize(i);
  Buffer& host = run.host_inputs[i - 1];
  host = Buffer(*cuda_pinned_, view.dtype(), view.shape(), MemoryCategory::kActivations);
  ops_->Copy(view, host.AsTensor(view.dtype(), view.shape()));
  ops_->Synchronize();  // before the device buffer goes back to the pool
  input.Reset();
}

void Engine::RestoreInput(size_t i, MicroBatchRun& run) {
  Buffer& host = run.host_inputs[i - 1];
  const Tensor view = run.out_views[i - 1];
  run.outputs[i - 1] =
      Buffer(activations_, view.dtype(), view.shape(), MemoryCategory::kActivations);
  run.out_views[i - 1] = run.outputs[i - 1].AsTensor(view.dtype(), view.shape());
  ops_->Copy(host.AsTensor(view.dtype(), view.shape()), run.out_views[i - 1]);
  ops_->Synchronize();
  host.Reset();
}

void Engine::Recompute(const nn::MicroBatch& mb, size_t i, MicroBatchRun& run) {
  const Tensor& out = run.out_views[i];
  Buffer scratch(activations_, out.dtype(), out.shape(), MemoryCategory::kActivations);
  const Tensor input = i == 0 ? run.input : run.out_views[i - 1];
  layers_[i]->Forward(mb, input, scratch.AsTensor(out.dtype(), out.shape()), run.ctx[i]);
}

}  // namespace ztrain
