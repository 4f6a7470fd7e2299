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
//
// A quantized weight (Note [Quantized base], nn/adapters.h) takes its blob's bytes in the
// region instead of its values (a quarter of bf16's for 4-bit, half for INT8), so everything
// above moves the quantized bytes: the stage-3 shards, the gathers, the offloaded shards.
// SetHeldFrozen quantizes it from the WHOLE weight (each rank whose part of the region holds
// some of the blob asks `fill` for all of the weight, in fp32, one weight at a time), and
// FrozenValues dequantizes it for exports. The layers dequantize it themselves.
#include <algorithm>

#include "engine/engine.h"
#include "engine/engine_state.h"

namespace ztrain {

int64_t Engine::FrozenBytes(const nn::ParamSpec& spec) const {
  if (!spec.quantized()) {
    return NumElements(spec.shape) * static_cast<int64_t>(DTypeSize(act_dtype_));
  }
  const int64_t bytes = kernels::LayoutOf(spec.quant, spec.quant_geometry).total;
  ZTRAIN_ASSERT(bytes % 4 == 0, "a quantized blob of ", bytes, " bytes");
  return bytes;
}

Tensor Engine::FrozenView(const Buffer& region, const Slot& s) const {
  if (region.data() == nullptr) return Tensor();
  char* at = region.data<char>() + s.offset;
  if (s.spec.quantized()) return Tensor(at, DType::kU8, {FrozenBytes(s.spec)}, region.device());
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
  // Offloaded to host memory on a device: into this rank's chunk beside the compute.
  const Tensor mine = out.Flat(dp_->rank() * (st.frozen_shard / 2), {st.frozen_shard / 2});
  return GatherHostShard(shard, mine, out);
}

void Engine::SetHeldFrozen(size_t l, const HeldParameterFill& fill,
                           const std::function<bool(const std::string&)>& only) {
  const LayerState& st = *states_[l];
  const auto es = static_cast<int64_t>(DTypeSize(act_dtype_));
  // The rank's bytes of the region: all of it, or its shard at stage 3.
  const int64_t begin = st.sharded ? dp_->rank() * st.frozen_shard : 0;
  const int64_t len = st.sharded ? st.frozen_shard : st.frozen_padded;
  const Tensor region = st.frozen.AsTensor(DType::kU8, {len});
  for (size_t slot : st.owned) {
    const Slot& s = slots_[slot];
    if (!s.frozen() || (only && !only(s.spec.name))) continue;
    // The parameter's bytes [lo, hi) that the rank holds.
    const int64_t bytes = FrozenBytes(s.spec);
    const int64_t lo = std::max(s.offset, begin) - s.offset;
    const int64_t hi = std::min(s.offset + bytes, begin + len) - s.offset;
    if (lo >= hi) continue;
    const Tensor dst = region.Flat(s.offset + lo - begin, {hi - lo});
    const Shape full_shape = FullShape(s.spec);
    if (s.spec.quantized()) {
      // The blob from the whole weight, then its held bytes into place.
      Buffer whole(staging(), DType::kF32, full_shape, MemoryCategory::kParameters);
      Buffer blob(staging(), DType::kU8, {bytes}, MemoryCategory::kParameters);
      if (computes_) {
        fill(s.spec.name, full_shape, 0, NumElements(full_shape), whole.data<float>());
        kernels::QuantizeInto(s.spec.quant, s.spec.quant_geometry, whole.data<float>(),
                              blob.data<uint8_t>());
      }
      ops_->Copy(blob.AsTensor(DType::kU8, {bytes}).Flat(lo, {hi - lo}), dst);
      ops_->Synchronize();  // before `blob` goes
      continue;
    }
    // Its held elements in fp32, one parameter at a time, then rounded into place.
    const int64_t first = lo / es, last = hi / es;
    Buffer staged(staging(), DType::kF32, {last - first}, MemoryCategory::kParameters);
    float* values = staged.data<float>();
    nn::ForEachSliceRun(s.spec.tp, s.spec.shape, [&](int64_t local, int64_t full, int64_t n) {
      const int64_t a = std::max(local, first), b = std::min(local + n, last);
      if (a < b && computes_)
        fill(s.spec.name, full_shape, full + (a - local), b - a, values + (a - first));
    });
    CopyIn(values, Tensor(dst.data(), act_dtype_, {last - first}, dst.device()));
    ops_->Synchronize();  // before `staged` goes
  }
}

std::vector<uint8_t> Engine::WholeFrozen(size_t l) {
  LayerState& st = *states_[l];
  std::vector<uint8_t> out(static_cast<size_t>(st.frozen_padded));
  if (st.frozen_padded == 0) return out;
  Buffer gathered;
  const Buffer* whole = &st.frozen;
  if (st.sharded) {
    gathered = Buffer(activations_, DType::kU8, {st.frozen_padded}, MemoryCategory::kParameters);
    WaitFor(*LaunchFrozenGather(l, gathered));
    whole = &gathered;
  }
  ops_->Copy(whole->AsTensor(DType::kU8, {st.frozen_padded}),
             Tensor(out.data(), DType::kU8, {st.frozen_padded}));
  ops_->Synchronize();
  return out;
}

std::vector<float> Engine::FrozenValues(const Slot& s, const std::vector<uint8_t>& region) const {
  std::vector<float> out(static_cast<size_t>(NumElements(s.spec.shape)));
  if (!computes_) return out;
  const Tensor values(out.data(), DType::kF32, s.spec.shape);
  auto* at = const_cast<uint8_t*>(region.data()) + s.offset;
  const std::unique_ptr<kernels::Ops> host = kernels::MakeCpuOps();
  if (s.spec.quantized()) {
    host->Dequantize(Tensor(at, DType::kU8, {FrozenBytes(s.spec)}), s.spec.quant,
                     s.spec.quant_geometry, values);
  } else {
    host->Copy(Tensor(at, act_dtype_, s.spec.shape), values);  // widened
  }
  return out;
}

int64_t Engine::NumTrainableParameters() const {
  int64_t n = 0;
  for (const Slot& s : slots_) n += s.frozen() ? 0 : NumElements(s.spec.shape);
  return n;
}

}  // namespace ztrain
