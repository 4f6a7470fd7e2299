// The engine's ZeRO parameter communication: the stage 3 gathers that follow a
// zero::PlanGathers plan and the stage 1/2 parameter all-gather after the step (Note [ZeRO in
// the engine], engine_state.h). Gradients are reduced by zero::GradientReducer (Note
// [Gradient reducer]), which SetUpReducer builds for the stage.
#include <algorithm>
#include <deque>

#include "engine/engine.h"
#include "engine/engine_state.h"
#include "offload/param_swapper.h"
#include "parallel/zero/gradient_reducer.h"

namespace ztrain {

// --- Stage 3: gathering parameters by plan (Note [ZeRO in the engine]) -------------------

void Engine::StartGatherPlan(int micro_batches, bool backward) {
  std::vector<bool> phases;
  for (int m = 0; m < micro_batches; ++m) {
    phases.push_back(false);
    if (backward) phases.push_back(true);
  }
  StartGatherPlan(phases);
}

void Engine::StartGatherPlan(const std::vector<bool>& phases) {
  ReleaseAllGathered();
  auto it = plans_.find(phases);
  if (it == plans_.end()) {
    // Gathers move the trained and the frozen parameters (Note [Frozen parameters in the
    // engine]): the limits count both, the frozen ones in elements of the compute dtype.
    std::vector<int64_t> sizes;
    for (const auto& st : states_) {
      sizes.push_back(st->padded + st->frozen_padded / static_cast<int64_t>(DTypeSize(act_dtype_)));
    }
    std::vector<zero::UnitUse> uses;
    const size_t n = layers_.size();
    for (const bool backward : phases) {
      for (size_t i = 0; i < n; ++i) uses.push_back(states_[backward ? n - 1 - i : i]->units);
    }
    const ZeroConfig& z = config_.zero;
    const zero::GatherLimits limits{.prefetch_bucket = z.stage3_prefetch_bucket_size,
                                    .max_live = z.stage3_max_live_parameters,
                                    .max_reuse_distance = z.stage3_max_reuse_distance,
                                    .persistence_threshold = z.stage3_param_persistence_threshold};
    it = plans_.emplace(phases, zero::PlanGathers(sizes, uses, limits)).first;
  }
  plan_ = &it->second;
  position_ = 0;
}

// Launches the plan's gathers for the next position and waits for the units layer l needs.
void Engine::GatherForUse(size_t l) {
  ZTRAIN_ASSERT(plan_ != nullptr && position_ < plan_->actions.size());
  for (size_t u : plan_->actions[position_].fetch) {
    LayerState& st = *states_[u];
    if (st.padded > 0) {
      st.gathered = Buffer(activations_, act_dtype_, {st.padded}, MemoryCategory::kParameters);
      st.gather = LaunchGather(u, st.gathered, act_dtype_);
    }
    if (st.frozen_padded > 0) {
      st.frozen_gathered =
          Buffer(activations_, DType::kU8, {st.frozen_padded}, MemoryCategory::kParameters);
      st.frozen_gather = LaunchFrozenGather(u, st.frozen_gathered);
    }
  }
  if (param_swap_) {
    // Read the shards of the next planned gathers while this layer computes.
    int ahead = static_cast<int>(config_.zero.offload_param.buffer_count);
    for (size_t q = position_ + 1; q < plan_->actions.size() && ahead > 0; ++q) {
      for (size_t u : plan_->actions[q].fetch) {
        if (ahead-- > 0) param_swap_->Prefetch(u);
      }
    }
  }
  for (size_t u : states_[l]->units) {
    LayerState& st = *states_[u];
    ZTRAIN_ASSERT(st.padded == 0 || st.gathered.data() != nullptr);
    for (comm::WorkPtr* w : {&st.gather, &st.frozen_gather}) {
      if (!*w) continue;
      WaitFor(**w);
      w->reset();
    }
  }
}

void Engine::ReleaseAfterUse() {
  for (size_t u : plan_->actions[position_].release) {
    ZTRAIN_ASSERT(!states_[u]->gather && !states_[u]->frozen_gather);
    states_[u]->gathered.Reset();
    states_[u]->frozen_gathered.Reset();
  }
  if (++position_ == plan_->actions.size()) plan_ = nullptr;
}

// Drops every gathered layer (after an error left a plan half done).
void Engine::ReleaseAllGathered() {
  for (auto& st : states_) {
    for (comm::WorkPtr* w : {&st->gather, &st->frozen_gather}) {
      if (*w) WaitFor(**w);
      w->reset();
    }
    st->gathered.Reset();
    st->frozen_gathered.Reset();
  }
  plan_ = nullptr;
}

// Stages 1 and 2: all-gathers every layer's updated shard back into the full parameters,
// with at most allgather_bucket_size gathered elements in flight.
void Engine::SetUpReducer() {
  std::vector<zero::ReduceRange> ranges;
  for (const auto& st : states_) ranges.push_back({st->padded, st->shard, st->opt_begin});
  zero::GradientReducer::Options o;
  o.policy = zero::ReducePolicyFor(stage_, config_.zero.reduce_scatter);
  o.accumulate = stage_ >= 2;  // every micro-batch reduces; the shard accumulates
  o.overlap = overlap_;
  o.bucket_elements = config_.zero.reduce_bucket_size;
  o.wait = [this](comm::Work& work) { WaitFor(work); };
  zero::ReducerHooks hooks;
  hooks.gradients = [this](size_t l, Buffer& staging) { return Fp32Gradients(l, staging); };
  hooks.shard = [this](size_t l) {
    const LayerState& st = *states_[l];
    return st.Flat(st.grad_shard, st.shard);
  };
  hooks.release = [this](size_t l) { states_[l]->grads.Reset(); };
  reducer_ = std::make_unique<zero::GradientReducer>(o, std::move(ranges), *dp_, *ops_,
                                                     activations_, std::move(hooks));
}

void Engine::GatherParameters() {
  struct InFlight {
    Buffer send;
    comm::WorkPtr work;
    int64_t elements;
  };
  std::deque<InFlight> flight;
  int64_t in_flight = 0;
  auto wait_oldest = [&] {
    WaitFor(*flight.front().work);
    in_flight -= flight.front().elements;
    flight.pop_front();
  };
  for (auto& st : states_) {
    if (st->padded == 0) continue;
    while (!flight.empty() && in_flight + st->padded > config_.zero.allgather_bucket_size) {
      wait_oldest();
    }
    // The send buffer is a copy: the gathered output covers this rank's own range too.
    Buffer send(activations_, DType::kF32, Shape{st->shard}, MemoryCategory::kCommunication);
    const Tensor send_view = send.AsTensor(DType::kF32, {st->shard});
    ops_->Copy(st->Flat(st->params, st->padded).Flat(st->opt_begin, {st->shard}), send_view);
    comm::WorkPtr work = dp_->AllGather(send_view, st->Flat(st->params, st->padded));
    flight.push_back({std::move(send), std::move(work), st->padded});
    in_flight += st->padded;
  }
  while (!flight.empty()) wait_oldest();
}

}  // namespace ztrain
