#pragma once
// Note [Whole parameters]
// The values of the model's parameters as whole tensors — the unsharded, unsplit tensors of
// the single-process model, in fp32 — read from and written to where this rank holds them:
//   - ForEach gives each owned parameter whole, layer by layer in model order: at ZeRO stage 3
//     the layer's shards are all-gathered first (the `gather` hook: collective over dp), a
//     tensor-parallel slice is all-gathered over the tp group and put together on the host,
//     a frozen parameter is widened (or dequantized) from its region (Note [Frozen regions]),
//     and on a device the values come to the host first;
//   - SetAll writes every owned parameter from its whole value (each rank keeping its shard
//     and its slice); not collective;
//   - SetHeld asks only for the elements this rank holds (Note [Reading only what a rank
//     holds]): a model file larger than one rank's memory loads when each rank asks for its own
//     elements, and random initialisation walks the same way. Layer l's held range
//     (zero::ParamTable::Held) is the whole layer's flat buffer, or at ZeRO-3 this rank's shard
//     of it. A parameter occupies [offset, offset + numel) of that buffer in its local
//     (tp-sliced) shape; each run of the slice (nn::ForEachSliceRun) maps local elements to
//     whole-parameter elements, so the intersection of a run with the held range is one
//     contiguous request to `fill`. The held range is opened on the host (in place when the
//     parameters are host memory; staged otherwise: a device, NVMe) and committed where it
//     lives (offload::ParamStore::OpenOnHost, Commit), one layer at a time.
// After writing, the parameter store refreshes the 16-bit copies layers compute with. Every
// access first settles the optimizer (the `settle` hook: Note [Deferred optimizer step]), so
// it sees the parameters as the last step left them.
#include <cstdint>
#include <functional>
#include <string>

#include "core/allocator.h"
#include "core/buffer.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "offload/param_store.h"
#include "parallel/comm/communicator.h"
#include "parallel/zero/frozen_regions.h"
#include "parallel/zero/param_table.h"

namespace ztrain {

class WholeParameters {
 public:
  using Fn = std::function<void(const std::string& name, const Tensor& value)>;
  // Writes elements [begin, begin + count) of whole parameter `name` (row-major in
  // full_shape) to `out` (Engine::HeldParameterFill).
  using HeldFill = zero::FrozenFill;
  struct Hooks {
    std::function<void()> settle;  // before any access (optional)
    // Stage 3: launches the all-gather of layer l's fp32 parameters into `whole` (its padded
    // size), wherever the shard lives.
    std::function<comm::WorkPtr(size_t l, const Buffer& whole)> gather;
    std::function<void(comm::Work&)> wait;  // blocks on a collective (the caller times it)
  };
  // Where buffers come from: `work` is memory the communicators write (the device's),
  // `staging` host memory for values on their way (the caching allocator on the CPU
  // backend), `host` plain host memory.
  struct Memory {
    Allocator& work;
    Allocator& staging;
    Allocator& host;
  };
  // None is owned; all must outlive this. `computes` is false for a shape-only engine, whose
  // SetHeld asks for nothing.
  WholeParameters(const zero::ParamTable& table, offload::ParamStore& held,
                  zero::FrozenRegions& frozen, comm::Communicator& tp, kernels::Ops& ops,
                  Memory memory, bool on_device, bool computes, Hooks hooks);

  // Calls fn(name, value) for every owned parameter, whole (valid during the call only). At
  // stage 3 collective over dp, and over tp when tensor parallelism splits parameters. With
  // `trainable_only` the frozen parameters are left out (and not gathered).
  void ForEach(const Fn& fn, bool trainable_only);
  // fill(name, destination) writes each owned parameter's whole value. Not collective.
  void SetAll(const Fn& fill);
  // Sets the elements this rank holds of the parameters `only` accepts (all without it).
  void SetHeld(const HeldFill& fill, const std::function<bool(const std::string&)>& only);

 private:
  bool sharded(size_t l) const { return held_.shape(l).sharded; }
  int64_t padded(size_t l) const { return held_.shape(l).padded; }
  // Layer l's fp32 parameters, whole, on the host (gathered at stage 3, copied from a
  // device, into `gathered` and `host_copy`, which must outlive the pointer).
  const float* WholeLayerOnHost(size_t l, Buffer& gathered, Buffer& host_copy);
  // A tensor-parallel slice `local` put together into its whole parameter (collective over
  // tp), in `full` (host memory).
  Tensor GatherSlices(const zero::ParamSlot& s, const Tensor& local, Buffer& full);

  const zero::ParamTable& table_;
  offload::ParamStore& held_;
  zero::FrozenRegions& frozen_;
  comm::Communicator& tp_;
  kernels::Ops& ops_;
  Memory memory_;
  const bool on_device_;
  const bool computes_;
  const Hooks hooks_;
};

}  // namespace ztrain
