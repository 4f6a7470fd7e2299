// The optimizer step: the parameters' parts in this rank's optimizer ranges, walking them
// with their Adam state (in memory, on a device, or tile by tile from NVMe), the clip and
// loss-scale coefficient, and AdamW on the device or on the host (Note [ZeRO in the engine],
// Note [Offload in the engine], Note [Devices in the engine]).
#include <algorithm>
#include <chrono>

#include "engine/engine.h"
#include "engine/engine_state.h"
#include "offload/optimizer_swapper.h"
#include "offload/param_swapper.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"

namespace ztrain {

std::vector<Engine::Part> Engine::OptimizerParts() const {
  std::vector<Part> parts;
  std::vector<int64_t> layer_base(states_.size());
  for (size_t l = 0, base = 0; l < states_.size(); base += states_[l]->opt_len, ++l) {
    layer_base[l] = static_cast<int64_t>(base);
  }
  for (const Slot& s : slots_) {
    if (s.frozen()) continue;
    const LayerState& st = *states_[s.layer];
    const int64_t begin = std::max(s.offset, st.opt_begin);
    const int64_t end = std::min(s.offset + NumElements(s.spec.shape), st.opt_begin + st.opt_len);
    if (begin < end) parts.push_back({&s, begin, end, layer_base[s.layer] + begin - st.opt_begin});
  }
  return parts;
}

double Engine::GradNorm() {
  // Each element once: a pipeline stage's copy of a weight another stage owns is left out.
  std::vector<Tensor> grads;
  for (size_t l = 0; l < states_.size(); ++l) {
    const LayerState& st = *states_[l];
    const Tensor g = st.Reduced();
    int64_t skip = 0;  // leading elements of g that belong to a copy
    for (const StageTie& tie : stage_ties_) {
      if (tie.copy && tie.layer == l) {
        skip = std::clamp<int64_t>(tie.elements - (stage_ >= 1 ? st.opt_begin : 0), 0, g.numel());
      }
    }
    if (skip < g.numel()) grads.push_back(g.Flat(skip, {g.numel() - skip}));
  }
  if (!computes_) grads.clear();  // shape-only: no values; the reductions still run
  if (stage_ == 0 && pp_->size() == 1 && tp_->size() == 1 && !on_device()) {
    return optim::GlobalNorm(grads);
  }
  double squares = optim::GradSquaredSum(*ops_, grads);
  if (tp_->size() > 1 && computes_) {
    // Parameters whole on every tp rank (layernorms, row-parallel biases) have equal
    // gradients there: each rank counts 1/tp of them, so the tp sum counts them once.
    squares -= (1.0 - 1.0 / tp_->size()) * ReplicatedSquares();
  }
  float sum = static_cast<float>(squares);
  if (stage_ >= 1) sum = AllReduceScalar(*dp_, sum);
  sum = AllReduceScalar(*pp_, sum);
  sum = AllReduceScalar(*tp_, sum);
  return std::sqrt(static_cast<double>(sum));
}

// The squared gradient elements of this rank's parameters that tensor parallelism does not
// split, within the rank's gradient range (copies of tied weights left out, as in GradNorm).
double Engine::ReplicatedSquares() {
  std::vector<Tensor> parts;
  for (const Slot& s : slots_) {
    if (s.spec.tp.split() || s.stage_copy || s.frozen()) continue;
    const LayerState& st = *states_[s.layer];
    const int64_t range_begin = stage_ >= 1 ? st.opt_begin : 0;
    const int64_t range_len = stage_ >= 1 ? st.shard : st.padded;
    const int64_t a = std::max(s.offset, range_begin);
    const int64_t b = std::min(s.offset + NumElements(s.spec.shape), range_begin + range_len);
    if (a >= b) continue;
    const Tensor g = st.Reduced();
    parts.push_back(g.Flat(a - range_begin, {b - a}));
  }
  return optim::GradSquaredSum(*ops_, parts);
}

void Engine::ForEachOptimizerRange(
    const std::vector<Part>& parts,
    const std::function<void(const Part&, int64_t, int64_t, float*, float*)>& fn, bool save,
    std::optional<size_t> layer) {
  if (!opt_swap_) {
    for (const Part& p : parts) {
      LayerState& st = *states_[p.slot->layer];
      const int64_t local = p.begin - st.opt_begin;
      if (st.exp_avg.device().is_cpu()) {
        fn(p, p.begin, p.end, st.exp_avg.data<float>() + local,
           st.exp_avg_sq.data<float>() + local);
        continue;
      }
      // m and v in device memory (checkpoints): through host copies.
      const int64_t n = p.end - p.begin;
      const Tensor m = st.Flat(st.exp_avg, st.opt_len).Flat(local, {n});
      const Tensor v = st.Flat(st.exp_avg_sq, st.opt_len).Flat(local, {n});
      std::vector<float> hm = ToHost(m), hv = ToHost(v);
      fn(p, p.begin, p.end, hm.data(), hv.data());
      if (save) {
        CopyIn(hm.data(), m);
        CopyIn(hv.data(), v);
        ops_->Synchronize();
      }
    }
    return;
  }
  size_t first = 0;  // the first part not wholly in earlier tiles
  // The swap wait is the time in ForEachTile less the time in fn.
  double in_fn = 0.0;
  const auto start = std::chrono::steady_clock::now();
  const offload::OptimizerSwapper::TileStep step =
      [&](int64_t tile_begin, int64_t count, float* m, float* v) {
        const ScopeTimer fn_timer(in_fn);
        const int64_t tile_end = tile_begin + count;
        for (size_t i = first; i < parts.size(); ++i) {
          const Part& p = parts[i];
          const int64_t g0 = std::max(p.global, tile_begin);
          const int64_t g1 = std::min(p.global + (p.end - p.begin), tile_end);
          if (g0 >= tile_end) break;
          if (g0 < g1) {
            fn(p, p.begin + (g0 - p.global), p.begin + (g1 - p.global), m + (g0 - tile_begin),
               v + (g0 - tile_begin));
          }
          if (g1 == p.global + (p.end - p.begin)) first = i + 1;
        }
      };
  if (layer) {
    opt_swap_->ForEachTileOf(*layer, step, save);
  } else {
    opt_swap_->ForEachTile(step, save);
  }
  swap_wait_seconds_ +=
      std::max(0.0, SecondsBetween(start, std::chrono::steady_clock::now()) - in_fn);
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
  const std::vector<Part> parts = OptimizerParts();
  if (defer_steps_) {
    DeferStep(parts, {lr, coef, updates + 1});
  } else if (!placement_.host_adam) {
    DeviceAdamStep(parts, lr, coef, updates + 1);
  } else {
    HostAdamStep(parts, lr, coef, updates + 1);
  }
  if ((stage_ == 1 || stage_ == 2) && dp_->size() > 1) GatherParameters();
  RefreshLowPrecision();
  stats.step = step_;
  stats.lr = lr;
  stats.clip_coef = scaler_ ? std::min(1.0, coef * scale) : coef;
  stats.grad_norm = grad_norm / scale;
}

// AdamW on the device, a parameter part at a time (Note [Devices in the engine]).
void Engine::DeviceAdamStep(const std::vector<Part>& parts, double lr, float coef,
                            int64_t adam_step) {
  if (!computes_) return;
  for (const Part& p : parts) {
    const Slot& s = *p.slot;
    LayerState& st = *states_[s.layer];
    const int64_t local = p.begin - st.opt_begin, n = p.end - p.begin;
    const Tensor param = st.sharded ? st.Flat(st.params, st.shard).Flat(local, {n})
                                    : st.Flat(st.params, st.padded).Flat(p.begin, {n});
    const Tensor grad = st.Reduced().Flat(local, {n});  // (local == p.begin at stage 0)
    optim::AdamStep(
        *ops_, optim::AdamArgsFor(config_.optimizer, param_groups_[s.group], lr, adam_step, coef),
        param, grad, st.Flat(st.exp_avg, st.opt_len).Flat(local, {n}),
        st.Flat(st.exp_avg_sq, st.opt_len).Flat(local, {n}));
  }
}

// AdamW on the host: the CPU backend, and offload on a device, where the reduced gradient
// ranges come to pinned host memory first and each layer's updated master range goes back to
// the device once the host has stepped it (Note [Devices in the engine]).
void Engine::HostAdamStep(const std::vector<Part>& parts, double lr, float coef,
                          int64_t adam_step) {
  if (on_device()) {
    for (auto& st : states_) {
      CopyOut(st->Flat(st->grad_shard, st->shard), st->grad_host.data<float>());
    }
    ops_->Synchronize();
  }
  // The device copy of the last layer stepped, issued when the step moves to the next layer.
  size_t stepped = states_.size();
  auto push_stepped = [&] {
    if (stepped == states_.size()) return;
    LayerState& st = *states_[stepped];
    if (st.master.data() == nullptr) return;
    const Tensor whole = st.Flat(st.params, st.sharded ? st.shard : st.padded);
    CopyIn(st.master.data<float>(), whole.Flat(st.sharded ? 0 : st.opt_begin, {st.opt_len}));
  };
  // The fp32 master of a layer's optimizer range. With parameters on NVMe one layer's shard
  // is loaded at a time (the next one read ahead) and stored back when the step moves on.
  size_t loaded = states_.size();
  Buffer staged;
  auto store_loaded = [&] {
    if (loaded == states_.size()) return;
    const ScopeTimer timer(swap_wait_seconds_);
    param_swap_->Store(loaded, staged.data<float>());
  };
  auto master = [&](size_t l) -> float* {
    LayerState& st = *states_[l];
    if (l != stepped) {
      push_stepped();
      stepped = l;
    }
    if (st.master.data() != nullptr) return st.master.data<float>();
    if (!param_swap_) return st.params.data<float>() + (st.sharded ? 0 : st.opt_begin);
    if (loaded != l) {
      store_loaded();
      staged = Buffer(staging(), DType::kF32, {st.shard}, MemoryCategory::kParameters);
      const ScopeTimer timer(swap_wait_seconds_);
      param_swap_->CopyOut(l, staged.data<float>());
      if (l + 1 < states_.size()) param_swap_->Prefetch(l + 1);
      loaded = l;
    }
    return staged.data<float>();
  };
  const StepArgs args{lr, coef, adam_step};
  auto adam = [&](const Part& p, int64_t begin, int64_t end, float* m, float* v) {
    HostAdamRange(p, begin, end, m, v, master(p.slot->layer), args);  // (stages, swaps the master)
  };
  ForEachOptimizerRange(parts, adam, /*save=*/true);
  push_stepped();
  if (param_swap_) {
    store_loaded();
    const ScopeTimer timer(swap_wait_seconds_);
    param_swap_->Flush();
  }
}

// Adam on elements [begin, end) of a part's layer, with their m and v; `master` is the fp32
// master of the layer's optimizer range.
void Engine::HostAdamRange(const Part& p, int64_t begin, int64_t end, float* m, float* v,
                           float* master, const StepArgs& a) {
  const Slot& s = *p.slot;
  LayerState& st = *states_[s.layer];
  const int64_t local = begin - st.opt_begin;
  const float* grad = on_device() ? st.grad_host.data<float>() + local
                                  : st.Reduced().data<float>() + local;  // local == begin at 0
  if (!computes_) return;
  optim::AdamStep(
      optim::AdamArgsFor(config_.optimizer, param_groups_[s.group], a.lr, a.adam_step, a.coef),
      master + local, grad, m, v, end - begin);
}

// Note [Deferred optimizer step]
// With the parameter shards on NVMe (stage 3, the CPU backend) reading every shard for the
// optimizer step and writing it back is the step's largest exposed cost, and the next
// forward reads every shard again for its gathers. So OptimizerStep steps nothing there: it
// records the step's arguments (lr, clip coefficient, Adam's step count), and every layer
// with an optimizer range becomes pending. A pending layer is stepped the next time its shard
// is read — by the next forward's gather (LaunchGather), which reads it anyway — on the shard
// as read, in the swapper's buffer (ParamSwapper::Acquire), from which it is written back in
// the background and copied for the gather; with m and v on NVMe too, with its own tiles
// (OptimizerSwapper::ForEachTileOf). The gatherer launches a prefetched layer's gather
// (and so its step) just before the layer that needs it, so the steps run beside the compute
// of the layers before, and its read-ahead of shards and of m and v tiles runs on from this
// step's backward into the next step's first layers (Note [Parameter gatherer]). Its reduced
// gradient shard is kept until then: ZeroGrad passes pending layers over, and they are zeroed
// once stepped.
// Everything else that reads or writes parameters or optimizer state — whole parameters,
// checkpoints, another OptimizerStep — applies every pending step first (ApplyPendingSteps),
// and a backward finds none (every trained layer's forward gathered it). Each element gets
// the same arithmetic with the same operands as when stepped at once, so the results are
// bitwise those.
void Engine::DeferStep(const std::vector<Part>& parts, const StepArgs& args) {
  ApplyPendingSteps();
  pending_ = PendingStep{args, std::vector<std::vector<Part>>(states_.size())};
  for (const Part& p : parts) pending_->parts[p.slot->layer].push_back(p);
  DropPendingWhenDone();
}

bool Engine::IsPending(size_t l) const { return pending_ && !pending_->parts[l].empty(); }

void Engine::DropPendingWhenDone() {
  for (size_t l = 0; l < states_.size(); ++l) {
    if (IsPending(l)) return;
  }
  pending_.reset();
}

void Engine::StepPending(size_t l) {
  if (!IsPending(l)) return;
  std::vector<Part> parts = std::move(pending_->parts[l]);
  pending_->parts[l].clear();
  float* master = nullptr;  // the shard, stepped in the swapper's buffer and written from it
  {
    const ScopeTimer timer(swap_wait_seconds_);
    master = param_swap_->Acquire(l);
  }
  auto adam = [&](const Part& p, int64_t begin, int64_t end, float* m, float* v) {
    HostAdamRange(p, begin, end, m, v, master, pending_->args);
  };
  try {
    ForEachOptimizerRange(parts, adam, /*save=*/true, l);
  } catch (...) {
    param_swap_->Release(l, /*changed=*/false);
    throw;
  }
  param_swap_->Release(l, /*changed=*/true);
  if (pending_->zero_grads) ZeroFill(states_[l]->grad_shard);
  DropPendingWhenDone();
}

void Engine::ApplyPendingSteps() {
  for (size_t l = 0; l < states_.size() && pending_; ++l) {
    if (!IsPending(l)) continue;
    for (size_t next = l + 1; next < states_.size(); ++next) {
      if (!IsPending(next)) continue;
      param_swap_->Prefetch(next);
      break;
    }
    StepPending(l);
  }
  if (param_swap_) {
    const ScopeTimer timer(swap_wait_seconds_);
    param_swap_->Flush();
  }
}

}  // namespace ztrain
