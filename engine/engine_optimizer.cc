// The optimizer step: the engine's side of zero::ShardedOptimizer (Note [Sharded optimizer],
// parallel/zero/sharded_optimizer.h) — where each layer's master, reduced gradients, m and v
// live (memory, a device, NVMe tiles) given to it as hooks — and the clip and loss-scale
// coefficient (Note [ZeRO in the engine], Note [Offload in the engine], Note [Devices in the
// engine]).
#include <algorithm>
#include <chrono>

#include "engine/engine_impl.h"
#include "engine/engine_state.h"
#include "optim/grad_clip.h"
#include "parallel/zero/param_gatherer.h"

namespace ztrain {

void EngineImpl::SetUpOptimizer() {
  zero::ShardedOptimizer::Options o{.optimizer = config_.optimizer,
                                    .host_step = placement_.host_adam,
                                    .defer = defer_steps_,
                                    .computes = computes_,
                                    .host_gradients = !on_device(),
                                    .sharded = zero_.shard_optimizer};
  optimizer_ = std::make_unique<zero::ShardedOptimizer>(
      o, param_groups_, zero::OptimizedLayersOf(*table_), zero::OptimizedParamsOf(*table_),
      zero::ShardedOptimizer::Groups{dp_, pp_, tp_}, *ops_, OptimizerHooksFor());
}

// Where the optimizer finds each layer's state: the engine's buffers, swappers and devices.
zero::OptimizerHooks EngineImpl::OptimizerHooksFor() {
  zero::OptimizerHooks h;
  h.gradient = [this](size_t l) { return states_[l]->Reduced(); };
  h.host_gradient = [this](size_t l) -> const float* {
    const LayerState& st = *states_[l];
    return on_device() ? st.grad_host.data<float>() : st.Reduced().data<float>();
  };
  h.walk_state = [this](std::optional<size_t> l, const zero::StateRange& fn, bool save) {
    moments_->Walk(l, fn, save);
  };
  h.all_reduce = [this](comm::Communicator& group, float value) {
    return AllReduceScalar(group, value);
  };
  if (on_device()) {
    h.gradients_to_host = [this] {
      for (auto& st : states_) {
        CopyOut(st->Flat(st->grad_shard, st->layout.shard), st->grad_host.data<float>());
      }
      ops_->Synchronize();
    };
  }
  h.acquire_master = [this](size_t l) { return held_->Acquire(l); };
  h.release_master = [this](size_t l, bool changed) { held_->Release(l, changed); };
  if (held_->swapped()) {
    h.prefetch_master = [this](size_t l) { held_->Prefetch(l); };
    h.flush_masters = [this] { held_->Flush(); };
  }
  h.device_params = [this](size_t l) { return held_->OptimizerRange(l); };
  h.device_state = [this](size_t l) { return moments_->DeviceState(l); };
  h.zero_gradient = [this](size_t l) { memory_.Zero(states_[l]->grad_shard); };
  return h;
}

double EngineImpl::GradNorm() { return optimizer_->GradNorm(); }

void EngineImpl::OptimizerStep(double grad_norm, StepStats& stats) {
  // Steps skipped for an fp16 overflow took no update: the lr schedule and Adam's step count
  // follow the updates taken (as DeepSpeed steps neither on an overflow).
  const int64_t updates = step_ - (scaler_ ? scaler_->skipped_steps() : 0);
  const double lr = schedule_->LrAt(updates);
  // fp16: grad_norm is of the scaled gradients; the update divides the scale out.
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  const float coef =
      scaler_ ? optim::UnscaleAndClipCoefficient(grad_norm, scale, config_.gradient_clipping)
              : optim::ClipCoefficient(grad_norm, config_.gradient_clipping);
  ++step_;
  optimizer_->Step({lr, coef, updates + 1});
  if (zero_.gather_after_step && dp_->size() > 1) {  // stages 1 and 2
    std::vector<Tensor> wholes;
    for (size_t l = 0; l < states_.size(); ++l) wholes.push_back(held_->HeldTensor(l));
    zero::GatherUpdatedShards(wholes, *dp_, *ops_, memory_.activations(),
                              config_.zero.allgather_bucket_size,
                              [this](comm::Work& work) { WaitFor(work); });
  }
  held_->RefreshComputeCopies();
  stats.step = step_;
  stats.lr = lr;
  stats.clip_coef = scaler_ ? std::min(1.0, coef * scale) : coef;
  stats.grad_norm = grad_norm / scale;
}

// Note [Deferred optimizer step]
// With the parameter shards on NVMe (stage 3, the CPU backend) reading every shard for the
// optimizer step and writing it back is the step's largest exposed cost, and the next
// forward reads every shard again for its gathers. So OptimizerStep steps nothing there: the
// sharded optimizer records the step's arguments (lr, clip coefficient, Adam's step count),
// and every layer with an optimizer range becomes pending (Note [Sharded optimizer]). A
// pending layer is stepped the next time its shard is read — by the next forward's gather
// (LaunchGather), which reads it anyway — on the shard as read, in the swapper's buffer
// (ParamStore::Acquire), from which it is written back in the background and copied for the
// gather; with m and v on NVMe too, with its own tiles
// (OptimizerSwapper::ForEachTileOf). The gatherer launches a prefetched layer's gather
// (and so its step) just before the layer that needs it, so the steps run beside the compute
// of the layers before, and its read-ahead of shards and of m and v tiles runs on from this
// step's backward into the next step's first layers (Note [Parameter gatherer]). Its reduced
// gradient shard is kept until then: ZeroGrad passes pending layers over, and they are zeroed
// once stepped.
// Everything else that reads or writes parameters or optimizer state — whole parameters,
// checkpoints, another OptimizerStep — applies every pending step first (ApplyPending),
// and a backward finds none (every trained layer's forward gathered it). Each element gets
// the same arithmetic with the same operands as when stepped at once, so the results are
// bitwise those.

}  // namespace ztrain
