// The engine's ZeRO parts: zero::ParamGatherer runs the stage 3 gathers (Note [Parameter
// gatherer]), zero::GradientReducer reduces gradients (Note [Gradient reducer]), each built
// here for the stage; and the stage 1/2 parameter all-gather after the step (Note [ZeRO in
// the engine], engine_state.h).
#include <algorithm>

#include "engine/engine_impl.h"
#include "engine/engine_state.h"
#include "parallel/zero/frozen_regions.h"
#include "parallel/zero/gradient_reducer.h"
#include "parallel/zero/param_gatherer.h"

namespace ztrain {

// Stage 3: the gatherer runs the gather plan (Note [Parameter gatherer]); the shards come
// from LaunchGather and the frozen regions, wherever they live, and NVMe reads ahead.
void EngineImpl::SetUpGatherer() {
  if (!zero_.shard_parameters) return;
  std::vector<zero::GatherUnit> units;
  for (size_t l = 0; l < states_.size(); ++l) {
    units.push_back({states_[l]->layout.padded, frozen_->padded(l), table_->layer(l).units});
  }
  const ZeroConfig& z = config_.zero;
  zero::ParamGatherer::Options o;
  o.dtype = act_dtype_;
  o.limits = {.prefetch_bucket = z.stage3_prefetch_bucket_size,
              .max_live = z.stage3_max_live_parameters,
              .max_reuse_distance = z.stage3_max_reuse_distance,
              .persistence_threshold = z.stage3_param_persistence_threshold};
  o.read_ahead = static_cast<int>(z.offload_param.buffer_count);
  // A deferred step leaves the shards on NVMe as the next step's forward reads them (Note
  // [Deferred optimizer step]): the reads can start in this step's backward.
  o.read_ahead_wraps = defer_steps_;
  // A pending layer's gather steps it: best beside the compute of the layers before it, not
  // all at the position that prefetches it.
  o.launch_at_use = defer_steps_;
  zero::GatherHooks hooks;
  hooks.gather = [this](size_t u, const Buffer& whole) {
    return LaunchGather(u, whole, act_dtype_);
  };
  hooks.gather_frozen = [this](size_t u, const Buffer& whole) {
    return frozen_->LaunchGather(u, whole);
  };
  if (held_->swapped()) {
    hooks.read_ahead = [this](size_t u) {
      held_->Prefetch(u);
      // A deferred step needs the layer's m and v too (Note [Deferred optimizer step]).
      if (defer_steps_) moments_->Prefetch(u);
    };
  }
  hooks.wait = [this](comm::Work& work) { WaitFor(work); };
  gatherer_ = std::make_unique<zero::ParamGatherer>(o, std::move(units), memory_.activations(),
                                                    std::move(hooks));
}

void EngineImpl::SetUpReducer() {
  std::vector<zero::ReduceRange> ranges;
  for (const auto& st : states_)
    ranges.push_back({st->layout.padded, st->layout.shard, st->layout.opt_begin});
  zero::GradientReducer::Options o;
  o.policy = zero_.reduce;
  o.accumulate = zero_.shard_gradients;  // every micro-batch reduces; the shard accumulates
  o.overlap = overlap_;
  o.bucket_elements = config_.zero.reduce_bucket_size;
  o.wait = [this](comm::Work& work) { WaitFor(work); };
  zero::ReducerHooks hooks;
  hooks.gradients = [this](size_t l, Buffer& staging) { return Fp32Gradients(l, staging); };
  hooks.shard = [this](size_t l) {
    const LayerState& st = *states_[l];
    return st.Flat(st.grad_shard, st.layout.shard);
  };
  hooks.release = [this](size_t l) { states_[l]->grads.Reset(); };
  reducer_ = std::make_unique<zero::GradientReducer>(o, std::move(ranges), *dp_, *ops_,
                                                     memory_.activations(), std::move(hooks));
}

}  // namespace ztrain
