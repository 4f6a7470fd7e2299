// Frozen parameters in the engine: the base of a LoRA fine-tune (nn/adapters.h).
//
// Note [Frozen parameters in the engine]
// A frozen parameter (ParamSpec::trainable false) never changes, so the engine keeps only its
// value, in the compute dtype: no fp32 master, no 16-bit copy, no gradient, no Adam state —
// 2 bytes a parameter under bf16 where a trained one costs 16 or more. Each layer's frozen
// parameters lie in a region of their own (LayerState::frozen), beside the flat buffers of the
// trained ones, each at a 16-element boundary (a packed run contiguous, as in the flat
// buffers), the region padded to a multiple of 64 x dp bytes so that it splits into dp equal
// shards:
//   - stages 0-2 hold the whole region on every rank (as DeepSpeed keeps frozen parameters
//     whole below stage 3);
//   - stage 3 holds the rank's shard and all-gathers the region together with the layer's
//     trained parameters, by the same plan (zero::PlanGathers, whose sizes count both), and
//     frees it with them. With offload_param the shard lives in host memory (pinned with
//     pin_memory) and is copied into its chunk of the gathered region before the gather; it
//     is not swapped to NVMe.
// A layer binds a frozen parameter's view into the region (gathered at stage 3) and an
// undefined gradient view, so its backward skips the gradient (Note [Frozen parameters],
// kernels/ops.h). Nothing else of the step sees a frozen parameter: the gradient buckets, the
// norm and the optimizer step walk the trained flat buffers only (a layer with no trained
// parameter has none and is skipped). Values go in and out in fp32: initialisation and
// loading (SetHeldParameters) write the rank's part of the region rounded to the compute
// dtype, whole values (ForEachFullParameter, exports) are widened from it. Checkpoints hold
// the trained state only: a frozen parameter comes back from model.init_from, or from
// training.seed, as it came the first time. A frozen weight tied to another pipeline stage's
// is held by both stages as their own frozen parameters, equal from the start.
#include <algorithm>

#include "engine/engine.h"
#include "engine/engine_state.h"

namespace ztrain {

Tensor Engine::FrozenView(const Buffer& region, const Slot& s) const {
  if (region.data() == nullptr) return Tensor();
  char* at = region.data<char>() + s.offset;
  return Tensor(at, act_dtype_, s.spec.shape, region.device());
}

// The region as 16-bit words: its byte count is even (a multiple of 64), and every backend
// copies and gathers 2-byte elements.
Tensor Engine::FrozenWords(const Buffer& region, int64_t bytes) {
  return region.AsTensor(DType::kU16, {bytes / 2});
}

comm::WorkPtr Engine::LaunchFrozenGather(size_t l, const Buffer& whole) {
  LayerState& st = *states_[l];
  const Tensor out = FrozenWords(whole, st.frozen_padded);
  const Tensor shard = FrozenWords(st.frozen, st.frozen_shard);
  if (st.frozen.device() == whole.device()) return dp_->AllGather(shard, out);
  // Offloaded to host memory on a device: into this rank's chunk, gathered in place.
  const Tensor mine = out.Flat(dp_->rank() * (st.frozen_shard / 2), {st.frozen_shard / 2});
  ops_->Copy(shard, mine);
  return dp_->AllGather(mine, out);
}

void Engine::SetHeldFrozen(size_t l, const HeldParameterFill& fill,
                           const std::function<bool(const std::string&)>& only) {
  const LayerState& st = *states_[l];
  const auto es = static_cast<int64_t>(DTypeSize(act_dtype_));
  const int64_t begin = (st.sharded ? dp_->rank() * st.frozen_shard : 0) / es;
  const int64_t len = (st.sharded ? st.frozen_shard : st.frozen_padded) / es;
  const Tensor region = st.frozen.AsTensor(act_dtype_, {len});
  for (size_t slot : st.owned) {
    const Slot& s = slots_[slot];
    if (!s.frozen() || (only && !only(s.spec.name))) continue;
    const int64_t at = s.offset / es;  // the parameter's first element in the region
    const int64_t lo = std::max(at, begin) - at;
    const int64_t hi = std::min(at + NumElements(s.spec.shape), begin + len) - at;
    if (lo >= hi) continue;
    // Its held elements [lo, hi) in fp32, one parameter at a time, then rounded into place.
    Buffer staged(staging(), DType::kF32, {hi - lo}, MemoryCategory::kParameters);
    float* values = staged.data<float>();
    const Shape full_shape = FullShape(s.spec);
    nn::ForEachSliceRun(s.spec.tp, s.spec.shape, [&](int64_t local, int64_t full, int64_t n) {
      const int64_t a = std::max(local, lo), b = std::min(local + n, hi);
      if (a < b && computes_)
        fill(s.spec.name, full_shape, full + (a - local), b - a, values + (a - lo));
    });
    CopyIn(values, region.Flat(at + lo - begin, {hi - lo}));
    ops_->Synchronize();  // before `staged` goes
  }
}

std::vector<float> Engine::WholeFrozen(size_t l) {
  LayerState& st = *states_[l];
  const int64_t n = st.frozen_padded / static_cast<int64_t>(DTypeSize(act_dtype_));
  std::vector<float> out(static_cast<size_t>(n));
  if (n == 0) return out;
  Buffer gathered;
  const Buffer* whole = &st.frozen;
  if (st.sharded) {
    gathered = Buffer(activations_, DType::kU8, {st.frozen_padded}, MemoryCategory::kParameters);
    WaitFor(*LaunchFrozenGather(l, gathered));
    whole = &gathered;
  }
  CopyOut(whole->AsTensor(act_dtype_, {n}), out.data());
  ops_->Synchronize();
  return out;
}

int64_t Engine::NumTrainableParameters() const {
  int64_t n = 0;
  for (const Slot& s : slots_) n += s.frozen() ? 0 : NumElements(s.spec.shape);
  return n;
}

}  // namespace ztrain
