// Whole-parameter access to the engine's state: parameters and gradients by name, every
// parameter whole (gathering ZeRO-3 shards over the dp group and tensor-parallel slices over
// the tp group), setting parameters from whole values, and the names and counts.
#include <algorithm>
#include <cstring>
#include <map>

#include "engine/engine.h"
#include "engine/engine_state.h"
#include "nn/init.h"
#include "parallel/zero/frozen_regions.h"

namespace ztrain {

Tensor Engine::Parameter(const std::string& name) const {
  const Slot& s = table_->Find(name);
  ZTRAIN_CHECK(!zero_.shard_parameters, "parameter '", name,
               "' is not kept whole at ZeRO stage 3: each rank "
               "holds only its shard; use ForEachFullParameter (collective)");
  if (s.frozen()) return frozen_->View(frozen_->held(s.layer), s.spec, s.offset);
  return held_->HeldTensor(s.layer).Flat(s.offset, s.spec.shape);
}

Shape Engine::ParameterShape(const std::string& name) const {
  return table_->Find(name).spec.shape;
}

bool Engine::Trainable(const std::string& name) const { return !table_->Find(name).frozen(); }

void Engine::InitialValues(const std::string& name, int64_t begin, int64_t count,
                           float* out) const {
  nn::InitParam(table_->Find(name).spec, config_.training.seed, Tensor(out, DType::kF32, {count}),
                begin);
}

Tensor Engine::Gradient(const std::string& name) const {
  const Slot& s = table_->Find(name);
  ZTRAIN_CHECK(!zero_.shard_gradients, "gradient '", name, "' is not kept whole at ZeRO stage ",
               zero_.stage, ": each rank holds only its reduced shard");
  ZTRAIN_CHECK(!s.frozen(), "parameter '", name, "' is frozen: it has no gradient");
  return states_[s.layer]->grads.AsTensor(DType::kF32, {states_[s.layer]->padded})
      .Flat(s.offset, s.spec.shape);
}

// Copies between a rank's slice (`local`) and the whole parameter (`full`) along the slice's
// runs; `to_full` says which way.
void Engine::CopySlice(const nn::TensorSlice& slice, const Shape& local_shape, float* local,
                       float* full, bool to_full) {
  nn::ForEachSliceRun(slice, local_shape, [&](int64_t l, int64_t f, int64_t n) {
    if (to_full) {
      std::memcpy(full + f, local + l, static_cast<size_t>(n) * sizeof(float));
    } else {
      std::memcpy(local + l, full + f, static_cast<size_t>(n) * sizeof(float));
    }
  });
}

void Engine::ForEachFullParameter(const std::function<void(const std::string&, const Tensor&)>& fn,
                                  bool trainable_only) {
  optimizer_->ApplyPending();  // Note [Deferred optimizer step]
  for (size_t l = 0; l < states_.size(); ++l) {
    LayerState& st = *states_[l];
    Buffer whole, host_copy;
    const float* base = held_->held(l).data<float>();
    if (st.sharded && st.padded > 0) {
      whole = Buffer(activations_, DType::kF32, {st.padded}, MemoryCategory::kParameters);
      WaitFor(*LaunchGather(l, whole));
      base = whole.data<float>();
    }
    if (on_device()) {  // the whole layer comes to the host
      host_copy = Buffer(*host_, DType::kF32, {st.padded}, MemoryCategory::kWorkspace);
      CopyOut(st.sharded ? st.Flat(whole, st.padded) : held_->HeldTensor(l),
              host_copy.data<float>());
      ops_->Synchronize();
      base = host_copy.data<float>();
    }
    // The frozen region's bytes on the host (collective at stage 3).
    const std::vector<uint8_t> frozen = trainable_only ? std::vector<uint8_t>() : frozen_->Whole(l);
    for (size_t slot : table_->layer(l).owned) {
      const Slot& s = table_->slot(slot);
      if (trainable_only && s.frozen()) continue;
      std::vector<float> frozen_values;  // widened or dequantized
      if (s.frozen()) frozen_values = frozen_->Values(s.spec, s.offset, frozen);
      float* at = s.frozen() ? frozen_values.data() : const_cast<float*>(base) + s.offset;
      const Tensor local(at, DType::kF32, s.spec.shape);
      if (!s.spec.tp.split()) {
        fn(s.spec.name, local);
        continue;
      }
      // A tensor-parallel slice: gather every rank's slice (where the communicator writes:
      // device memory on a GPU, from the host copy), then put each in its place on the host.
      const int t = tp_->size();
      const int64_t n = local.numel();
      Buffer slices(activations_, DType::kF32, {t * n}, MemoryCategory::kWorkspace);
      WaitFor(*tp_->AllGather(local, slices.AsTensor(DType::kF32, {t * n})));
      float* gathered = slices.data<float>();
      Buffer host_slices;
      if (on_device()) {
        host_slices = Buffer(*host_, DType::kF32, {t * n}, MemoryCategory::kWorkspace);
        CopyOut(slices.AsTensor(DType::kF32, {t * n}), host_slices.data<float>());
        ops_->Synchronize();
        gathered = host_slices.data<float>();
      }
      const Shape full_shape = nn::FullShape(s.spec);
      Buffer full(staging(), DType::kF32, full_shape, MemoryCategory::kWorkspace);
      nn::TensorSlice slice = s.spec.tp;
      for (int r = 0; r < t; ++r) {
        slice.part = r;
        CopySlice(slice, s.spec.shape, gathered + r * n, full.data<float>(), /*to_full=*/true);
      }
      fn(s.spec.name, full.AsTensor(DType::kF32, full_shape));
    }
  }
}

void Engine::SetFullParameters(
    const std::function<void(const std::string&, const Tensor&)>& fill) {
  optimizer_->ApplyPending();  // Note [Deferred optimizer step]
  for (size_t l = 0; l < states_.size(); ++l) {
    LayerState& st = *states_[l];
    Buffer whole;  // the whole layer on the host, when the parameters are not
    float* base = held_->held(l).data<float>();
    if (st.sharded || on_device()) {
      whole = Buffer(staging(), DType::kF32, {st.padded}, MemoryCategory::kWorkspace);
      whole.Zero();
      base = whole.data<float>();
    }
    for (size_t slot : table_->layer(l).owned) {
      const Slot& s = table_->slot(slot);
      if (s.frozen()) continue;  // below
      if (!s.spec.tp.split()) {
        fill(s.spec.name, Tensor(base + s.offset, DType::kF32, s.spec.shape));
        continue;
      }
      const Shape full_shape = nn::FullShape(s.spec);
      Buffer full(staging(), DType::kF32, full_shape, MemoryCategory::kWorkspace);  // host
      fill(s.spec.name, full.AsTensor(DType::kF32, full_shape));
      CopySlice(s.spec.tp, s.spec.shape, base + s.offset, full.data<float>(), /*to_full=*/false);
    }
    if (whole.data() != nullptr) held_->Write(l, base + (st.sharded ? st.opt_begin : 0));
    // Frozen parameters: each whole value once, its held runs stored.
    std::map<std::string, Buffer> values;
    frozen_->SetHeld(l, [&](const std::string& name, const Shape& full_shape, int64_t begin,
                            int64_t count, float* out) {
      auto it = values.find(name);
      if (it == values.end()) {
        it = values
                 .emplace(name,
                          Buffer(staging(), DType::kF32, full_shape, MemoryCategory::kWorkspace))
                 .first;
        fill(name, it->second.AsTensor(DType::kF32, full_shape));
      }
      std::memcpy(out, it->second.data<float>() + begin,
                  static_cast<size_t>(count) * sizeof(float));
    });
  }
  held_->Flush();
  held_->RefreshComputeCopies();
}

// Note [Reading only what a rank holds]: a model file larger than one rank's memory loads
// when each rank asks only for its own elements; random initialisation (InitParameters)
// walks the same way. Layer l's held range (zero::ParamTable::Held) is the whole layer's flat
// buffer, or at ZeRO-3 this rank's shard of it. A parameter occupies
// [offset, offset + numel) of that buffer in its local (tp-sliced) shape; each run of the
// slice (nn::ForEachSliceRun) maps local elements to whole-parameter elements, so the
// intersection of a run with the held range is one contiguous request to `fill`. Parameters
// in host memory are written in place; elsewhere (a device, NVMe) the held range is staged
// on the host, one layer at a time, and stored where they live (ParamStore::Write,
// which also refreshes the fp32 master).
void Engine::SetHeldParameters(const HeldParameterFill& fill,
                               const std::function<bool(const std::string&)>& only) {
  optimizer_->ApplyPending();  // Note [Deferred optimizer step]
  for (size_t l = 0; l < states_.size(); ++l) {
    const int64_t held_begin = table_->Held(l).begin;
    // The parameters not chosen are written back as they are.
    Buffer staged;
    float* held = held_->OpenOnHost(l, staged, MemoryCategory::kParameters, bool(only));
    // A shape-only engine walks the staging copies and writes nothing; frozen parameters are
    // below.
    table_->ForEachHeldPart(l, [&](const Slot& s, int64_t lo, int64_t hi) {
      if (!computes_ || (only && !only(s.spec.name))) return;
      const Shape full_shape = nn::FullShape(s.spec);
      nn::ForEachSliceRun(s.spec.tp, s.spec.shape, [&](int64_t local, int64_t full, int64_t n) {
        const int64_t a = std::max(local, lo), b = std::min(local + n, hi);
        if (a < b) fill(s.spec.name, full_shape, full + (a - local), b - a,
                        held + (s.offset + a - held_begin));
      });
    });
    held_->Commit(l, staged);
    frozen_->SetHeld(l, fill, only);
  }
  held_->Flush();
  held_->RefreshComputeCopies();
}

std::vector<std::string> Engine::ParameterNames() const {
  std::vector<std::string> names;
  for (const Slot& s : table_->slots()) names.push_back(s.spec.name);
  return names;
}

int64_t Engine::NumParameters() const { return table_->NumParameters(); }

int64_t Engine::NumTrainableParameters() const {
  return table_->NumParameters(/*trainable_only=*/true);
}

int64_t Engine::PaddedParameters() const {
  int64_t n = 0;
  for (const auto& st : states_) n += st->padded;
  return n;
}

}  // namespace ztrain
