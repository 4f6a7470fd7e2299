// The optimizer step: the engine's side of zero::ShardedOptimizer (Note [Sharded optimizer],
// parallel/zero/sharded_optimizer.h) — where each layer's master, reduced gradients, m and v
// live (memory, a device, NVMe tiles) given to it as hooks — and the clip and loss-scale
// coefficient (Note [ZeRO in the engine], Note [Offload in the engine], Note [Devices in the
// engine]).
#include <algorithm>
#include <chrono>

#include "engine/engine.h"
#include "engine/engine_state.h"
#include "offload/optimizer_swapper.h"
#include "offload/param_swapper.h"
#include "optim/grad_clip.h"

namespace ztrain {

void Engine::SetUpOptimizer() {
  std::vector<zero::OptimizedLayer> layers;
  for (size_t l = 0; l < states_.size(); ++l) {
    zero::OptimizedLayer& layer = layers.emplace_back();
    layer.opt_begin = states_[l]->opt_begin;
    layer.opt_len = states_[l]->opt_len;
    for (const StageTie& tie : stage_ties_) {
      if (tie.copy && tie.layer == l) layer.leading_copy = tie.elements;
    }
  }
  std::vector<zero::OptimizedParam> params;  // one per slot, in order
  for (const Slot& s : slots_) {
    params.push_back({s.layer, s.offset, NumElements(s.spec.shape), s.group, !s.frozen(),
                      !s.spec.tp.split(), s.stage_copy});
  }
  zero::ShardedOptimizer::Options o{.optimizer = config_.optimizer,
                                    .host_step = placement_.host_adam,
                                    .defer = defer_steps_,
                                    .computes = computes_,
                                    .host_gradients = !on_device(),
                                    .sharded = zero_.shard_optimizer};
  optimizer_ = std::make_unique<zero::ShardedOptimizer>(
      o, param_groups_, std::move(layers), std::move(params),
      zero::ShardedOptimizer::Groups{dp_, pp_, tp_}, *ops_, OptimizerHooksFor());
}

// Where the optimizer finds each layer's state: the engine's buffers, swappers and devices.
zero::OptimizerHooks Engine::OptimizerHooksFor() {
  zero::OptimizerHooks h;
  h.gradient = [this](size_t l) { return states_[l]->Reduced(); };
  h.host_gradient = [this](size_t l) -> const float* {
    const LayerState& st = *states_[l];
    return on_device() ? st.grad_host.data<float>() : st.Reduced().data<float>();
  };
  h.walk_state = [this](std::optional<size_t> l, const zero::StateRange& fn, bool save) {
    WalkOptimizerState(l, fn, save);
  };
  h.all_reduce = [this](comm::Communicator& group, float value) {
    return AllReduceScalar(group, value);
  };
  if (on_device()) {
    h.gradients_to_host = [this] {
      for (auto& st : states_) {
        CopyOut(st->Flat(st->grad_shard, st->shard), st->grad_host.data<float>());
      }
      ops_->Synchronize();
    };
  }
  h.acquire_master = [this](size_t l) { return AcquireMaster(l); };
  h.release_master = [this](size_t l, bool changed) { ReleaseMaster(l, changed); };
  if (param_swap_) {
    h.prefetch_master = [this](size_t l) { param_swap_->Prefetch(l); };
    h.flush_masters = [this] {
      const ScopeTimer timer(swap_wait_seconds_);
      param_swap_->Flush();
    };
  }
  h.device_params = [this](size_t l) {
    const LayerState& st = *states_[l];
    return st.sharded ? st.Flat(st.params, st.shard)
                      : st.Flat(st.params, st.padded).Flat(st.opt_begin, {st.opt_len});
  };
  h.device_state = [this](size_t l) {
    const LayerState& st = *states_[l];
    return std::pair{st.Flat(st.exp_avg, st.opt_len), st.Flat(st.exp_avg_sq, st.opt_len)};
  };
  h.zero_gradient = [this](size_t l) { ZeroFill(states_[l]->grad_shard); };
  return h;
}

double Engine::GradNorm() { return optimizer_->GradNorm(); }

// m and v of layer l (every layer when nullopt), on the host: the buffers in host memory, host
// copies of those in device memory (checkpoints; written back when `save`), or the NVMe
// tiles (the time blocked on them counted as swap wait).
void Engine::WalkOptimizerState(std::optional<size_t> layer, const zero::StateRange& fn,
                                bool save) {
  if (opt_swap_) {
    double in_fn = 0.0;  // the swap wait is the time in the walk less the time in fn
    const auto start = std::chrono::steady_clock::now();
    const offload::OptimizerSwapper::TileStep step = [&](int64_t begin, int64_t count, float* m,
                                                         float* v) {
      const ScopeTimer fn_timer(in_fn);
      fn(begin, count, m, v);
    };
    if (layer) {
      opt_swap_->ForEachTileOf(*layer, step, save);
    } else {
      opt_swap_->ForEachTile(step, save);
    }
    swap_wait_seconds_ +=
        std::max(0.0, SecondsBetween(start, std::chrono::steady_clock::now()) - in_fn);
    return;
  }
  const size_t first = layer.value_or(0), last = layer ? *layer + 1 : states_.size();
  for (size_t l = first; l < last; ++l) {
    LayerState& st = *states_[l];
    if (st.opt_len == 0) continue;
    if (st.exp_avg.device().is_cpu()) {
      fn(optimizer_->base(l), st.opt_len, st.exp_avg.data<float>(), st.exp_avg_sq.data<float>());
      continue;
    }
    const Tensor m = st.Flat(st.exp_avg, st.opt_len), v = st.Flat(st.exp_avg_sq, st.opt_len);
    std::vector<float> hm = ToHost(m), hv = ToHost(v);
    fn(optimizer_->base(l), st.opt_len, hm.data(), hv.data());
    if (save) {
      CopyIn(hm.data(), m);
      CopyIn(hv.data(), v);
      ops_->Synchronize();
    }
  }
}

// The fp32 master of layer l's optimizer range on the host: the pinned copy beside device
// parameters (copied back to the device on release), the host parameters themselves, or the
// shard in the parameter swapper's buffer (written back from there on release).
float* Engine::AcquireMaster(size_t l) {
  LayerState& st = *states_[l];
  if (st.master.data() != nullptr) return st.master.data<float>();
  if (!param_swap_) return st.params.data<float>() + (st.sharded ? 0 : st.opt_begin);
  const ScopeTimer timer(swap_wait_seconds_);
  return param_swap_->Acquire(l);
}

void Engine::ReleaseMaster(size_t l, bool changed) {
  LayerState& st = *states_[l];
  if (st.master.data() != nullptr) {
    if (!changed) return;
    const Tensor whole = st.Flat(st.params, st.sharded ? st.shard : st.padded);
    CopyIn(st.master.data<float>(), whole.Flat(st.sharded ? 0 : st.opt_begin, {st.opt_len}));
  } else if (param_swap_) {
    param_swap_->Release(l, changed);
  }
}

void Engine::OptimizerStep(double grad_norm, StepStats& stats) {
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
  if (zero_.gather_after_step && dp_->size() > 1) GatherParameters();
  RefreshLowPrecision();
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
// (ParamSwapper::Acquire), from which it is written back in the background and copied for the
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
