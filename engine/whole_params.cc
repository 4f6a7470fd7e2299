// Note [Whole parameters] is in whole_params.h.
#include "engine/whole_params.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

namespace ztrain {
namespace {

// Copies between a rank's slice (`local`) and the whole parameter (`full`) along the slice's
// runs; `to_full` says which way.
void CopySlice(const nn::TensorSlice& slice, const Shape& local_shape, float* local, float* full,
               bool to_full) {
  nn::ForEachSliceRun(slice, local_shape, [&](int64_t l, int64_t f, int64_t n) {
    if (to_full) {
      std::memcpy(full + f, local + l, static_cast<size_t>(n) * sizeof(float));
    } else {
      std::memcpy(local + l, full + f, static_cast<size_t>(n) * sizeof(float));
    }
  });
}

}  // namespace

WholeParameters::WholeParameters(const zero::ParamTable& table, offload::ParamStore& held,
                                 zero::FrozenRegions& frozen, comm::Communicator& tp,
                                 kernels::Ops& ops, Memory memory, bool on_device, bool computes,
                                 Hooks hooks)
    : table_(table),
      held_(held),
      frozen_(frozen),
      tp_(tp),
      ops_(ops),
      memory_(memory),
      on_device_(on_device),
      computes_(computes),
      hooks_(std::move(hooks)) {}

const float* WholeParameters::WholeLayerOnHost(size_t l, Buffer& gathered, Buffer& host_copy) {
  const float* base = held_.held(l).data<float>();
  if (sharded(l) && padded(l) > 0) {
    gathered = Buffer(memory_.work, DType::kF32, {padded(l)}, MemoryCategory::kParameters);
    hooks_.wait(*hooks_.gather(l, gathered));
    base = gathered.data<float>();
  }
  if (on_device_) {  // the whole layer comes to the host
    host_copy = Buffer(memory_.host, DType::kF32, {padded(l)}, MemoryCategory::kWorkspace);
    const Tensor src =
        sharded(l) ? gathered.AsTensor(DType::kF32, {padded(l)}) : held_.HeldTensor(l);
    ops_.Copy(src, host_copy.AsTensor(DType::kF32, src.shape()));
    ops_.Synchronize();
    base = host_copy.data<float>();
  }
  return base;
}

// Every rank's slice gathered where the communicator writes (device memory on a GPU, from the
// host copy), then each put in its place on the host.
Tensor WholeParameters::GatherSlices(const zero::ParamSlot& s, const Tensor& local, Buffer& full) {
  const int t = tp_.size();
  const int64_t n = local.numel();
  Buffer slices(memory_.work, DType::kF32, {t * n}, MemoryCategory::kWorkspace);
  hooks_.wait(*tp_.AllGather(local, slices.AsTensor(DType::kF32, {t * n})));
  float* gathered = slices.data<float>();
  Buffer host_slices;
  if (on_device_) {
    host_slices = Buffer(memory_.host, DType::kF32, {t * n}, MemoryCategory::kWorkspace);
    ops_.Copy(slices.AsTensor(DType::kF32, {t * n}), host_slices.AsTensor(DType::kF32, {t * n}));
    ops_.Synchronize();
    gathered = host_slices.data<float>();
  }
  const Shape full_shape = nn::FullShape(s.spec);
  full = Buffer(memory_.staging, DType::kF32, full_shape, MemoryCategory::kWorkspace);
  nn::TensorSlice slice = s.spec.tp;
  for (int r = 0; r < t; ++r) {
    slice.part = r;
    CopySlice(slice, s.spec.shape, gathered + r * n, full.data<float>(), /*to_full=*/true);
  }
  return full.AsTensor(DType::kF32, full_shape);
}

void WholeParameters::ForEach(const Fn& fn, bool trainable_only) {
  if (hooks_.settle) hooks_.settle();
  for (size_t l = 0; l < table_.num_layers(); ++l) {
    Buffer gathered, host_copy;
    const float* base = WholeLayerOnHost(l, gathered, host_copy);
    // The frozen region's bytes on the host (collective at stage 3).
    const std::vector<uint8_t> frozen = trainable_only ? std::vector<uint8_t>() : frozen_.Whole(l);
    for (size_t slot : table_.layer(l).owned) {
      const zero::ParamSlot& s = table_.slot(slot);
      if (trainable_only && s.frozen()) continue;
      std::vector<float> frozen_values;  // widened or dequantized
      if (s.frozen()) frozen_values = frozen_.Values(s.spec, s.offset, frozen);
      float* at = s.frozen() ? frozen_values.data() : const_cast<float*>(base) + s.offset;
      const Tensor local(at, DType::kF32, s.spec.shape);
      if (!s.spec.tp.split()) {
        fn(s.spec.name, local);
        continue;
      }
      Buffer full;
      fn(s.spec.name, GatherSlices(s, local, full));
    }
  }
}

void WholeParameters::SetAll(const Fn& fill) {
  if (hooks_.settle) hooks_.settle();
  for (size_t l = 0; l < table_.num_layers(); ++l) {
    Buffer whole;  // the whole layer on the host, when the parameters are not
    float* base = held_.held(l).data<float>();
    if (sharded(l) || on_device_) {
      whole = Buffer(memory_.staging, DType::kF32, {padded(l)}, MemoryCategory::kWorkspace);
      whole.Zero();
      base = whole.data<float>();
    }
    for (size_t slot : table_.layer(l).owned) {
      const zero::ParamSlot& s = table_.slot(slot);
      if (s.frozen()) continue;  // below
      if (!s.spec.tp.split()) {
        fill(s.spec.name, Tensor(base + s.offset, DType::kF32, s.spec.shape));
        continue;
      }
      const Shape full_shape = nn::FullShape(s.spec);
      Buffer full(memory_.staging, DType::kF32, full_shape, MemoryCategory::kWorkspace);  // host
      fill(s.spec.name, full.AsTensor(DType::kF32, full_shape));
      CopySlice(s.spec.tp, s.spec.shape, base + s.offset, full.data<float>(), /*to_full=*/false);
    }
    if (whole.data() != nullptr) held_.Write(l, base + table_.Held(l).begin);
    // Frozen parameters: each whole value once, its held runs stored.
    std::map<std::string, Buffer> values;
    frozen_.SetHeld(l, [&](const std::string& name, const Shape& full_shape, int64_t begin,
                           int64_t count, float* out) {
      auto it = values.find(name);
      if (it == values.end()) {
        it = values
                 .emplace(name, Buffer(memory_.staging, DType::kF32, full_shape,
                                       MemoryCategory::kWorkspace))
                 .first;
        fill(name, it->second.AsTensor(DType::kF32, full_shape));
      }
      std::memcpy(out, it->second.data<float>() + begin,
                  static_cast<size_t>(count) * sizeof(float));
    });
  }
  held_.Flush();
  held_.RefreshComputeCopies();
}

void WholeParameters::SetHeld(const HeldFill& fill,
                              const std::function<bool(const std::string&)>& only) {
  if (hooks_.settle) hooks_.settle();
  for (size_t l = 0; l < table_.num_layers(); ++l) {
    const int64_t held_begin = table_.Held(l).begin;
    // The parameters not chosen are written back as they are.
    Buffer staged;
    float* held = held_.OpenOnHost(l, staged, MemoryCategory::kParameters, bool(only));
    // A shape-only engine walks the staging copies and writes nothing; frozen parameters are
    // below.
    table_.ForEachHeldPart(l, [&](const zero::ParamSlot& s, int64_t lo, int64_t hi) {
      if (!computes_ || (only && !only(s.spec.name))) return;
      const Shape full_shape = nn::FullShape(s.spec);
      nn::ForEachSliceRun(s.spec.tp, s.spec.shape, [&](int64_t local, int64_t full, int64_t n) {
        const int64_t a = std::max(local, lo), b = std::min(local + n, hi);
        if (a < b)
          fill(s.spec.name, full_shape, full + (a - local), b - a,
               held + (s.offset + a - held_begin));
      });
    });
    held_.Commit(l, staged);
    frozen_.SetHeld(l, fill, only);
  }
  held_.Flush();
  held_.RefreshComputeCopies();
}

}  // namespace ztrain
