#pragma once
// OptimizerStateStore: where AdamW's m and v live — device memory, host or pinned host
// memory, or NVMe tiles — behind the face of the parameter store (Note [Optimizer state
// store]).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "offload/optimizer_swapper.h"
#include "offload/param_store.h"
#include "offload/placement.h"

namespace ztrain::offload {

// Note [Optimizer state store]
// Each layer's optimizer range (opt_len elements of the rank's flat parameters, Note [ZeRO in
// the engine]) has fp32 m and v. They live where the placement's `optimizer` says: one
// buffer each in device, host or pinned memory, or, on NVMe, the OptimizerSwapper's file of
// tiles (the layers' ranges in order as one array). The optimizer sees them in two ways:
// DeviceState(l), the buffers themselves (the device step), and Walk, which hands every range
// of layer l's state (every layer's) to a function on the host in order — the buffers in host
// memory as they are, device buffers as host copies (written back when `save`), NVMe tiles
// through the swapper's buffers. A range's begin is global: layer l's state starts at the
// sum of the opt_len of the layers before it. Prefetch reads a layer's first tiles ahead.
class OptimizerStateStore {
 public:
  // fn(global_begin, count, m, v): m and v of elements [global_begin, global_begin + count).
  using Range = std::function<void(int64_t global_begin, int64_t count, float* m, float* v)>;
  // `computes` false: shape-only, no values move.
  OptimizerStateStore(Place place, kernels::Ops& ops, ParamStore::Allocate allocate,
                      bool computes = true);
  ~OptimizerStateStore();
  OptimizerStateStore(const OptimizerStateStore&) = delete;
  OptimizerStateStore& operator=(const OptimizerStateStore&) = delete;

  // The next layer's m and v (none on NVMe; layers are added in order).
  void AddLayer(int64_t opt_len);
  // NVMe: the swapper that holds every layer's m and v from now on, and what it needs kept
  // alive until it goes (its I/O engine and swap directory: Note [NVMe offload setup]).
  void SwapTo(std::unique_ptr<OptimizerSwapper> swapper, std::shared_ptr<const void> needs = {});

  bool swapped() const { return swapper_ != nullptr; }
  const OptimizerSwapper* swapper() const { return swapper_.get(); }
  // Layer l's m and v buffers as fp32 tensors (not on NVMe).
  std::pair<Tensor, Tensor> DeviceState(size_t l) const;
  void Walk(std::optional<size_t> layer, const Range& fn, bool save);
  void Prefetch(size_t l);
  // Seconds spent waiting for the swapper's I/O (a walk's time outside fn) since construction.
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Layer {
    int64_t opt_len = 0;
    int64_t base = 0;  // where the layer's state starts in the global order
    Buffer m, v;
  };
  void WalkMemory(size_t l, const Range& fn, bool save);

  Place place_;
  kernels::Ops& ops_;
  ParamStore::Allocate allocate_;
  bool computes_;
  std::vector<Layer> layers_;
  std::shared_ptr<const void> swapper_needs_;  // outlives swapper_ (declared before it)
  std::unique_ptr<OptimizerSwapper> swapper_;
  double wait_seconds_ = 0.0;
};

}  // namespace ztrain::offload
