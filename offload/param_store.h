#pragma once
// ParamStore: where each layer's held parameters live — device memory, host or pinned host
// memory, or NVMe — behind one face (Note [Parameter store]).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/buffer.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "offload/param_swapper.h"
#include "offload/placement.h"

namespace ztrain::offload {

// Note [Parameter store]
// A layer's flat fp32 parameters (Note [ZeRO in the engine]) are `padded` elements; a rank
// holds all of them, or at stage 3 (`sharded`) only its shard [opt_begin, opt_begin + shard).
// The optimizer updates the range opt_begin + [0, opt_len) of what is held. Where the held
// elements live follows the placement (Note [State placement]), decided once:
//   - device or host memory: one fp32 buffer, `held(l)`;
//   - a device with AdamW on the host (offload_optimizer cpu, parameters on the device): the
//     device buffer and a pinned fp32 master of the optimizer range, which the step updates
//     and Release copies back;
//   - NVMe (offload_param nvme, stage 3): no buffer; the ParamSwapper holds the shards.
// Under mixed precision the store also keeps each layer's compute-dtype copy
// (`compute_copy(l)`): the whole layer on the device at stages 0-2, the shard's copy beside it
// at stage 3 when a device's shards are in host memory (the gathers move it; Note [Offloaded
// shards beside compute] in engine/engine.cc); RefreshComputeCopies rounds the fp32 values
// into it after every change.
// Everything that reads or writes held values goes through the face, so no caller branches on
// where they live: Read/Write move the held elements to and from host memory (Write keeps
// the master in step), OpenOnHost/Commit give a host view to fill in place (the buffer
// itself when it is host memory, else a staged copy stored back on Commit), Acquire/Release
// the optimizer range's fp32 master for an update in place, and GatherSource the shard a
// stage-3 gather sends, in the gather's dtype. Prefetch reads a shard ahead; Flush waits for
// every write. Every path moves the same values: where they live changes no result.
// With shape-only allocators (Note [Shape-only engine]) the store makes its buffers and moves
// no values.
struct HeldShape {
  int64_t padded = 0;
  int64_t shard = 0;
  int64_t opt_begin = 0, opt_len = 0;
  bool sharded = false;  // stage 3: only the rank's shard is held
  int64_t held() const { return sharded ? shard : padded; }
  int64_t held_begin() const { return sharded ? opt_begin : 0; }
  // Where the optimizer range starts in what is held.
  int64_t opt_in_held() const { return opt_begin - held_begin(); }
};

class ParamStore {
 public:
  // A zeroed buffer of `elements` of `dtype` where `place` says, from the caller's tracked
  // allocators.
  using Allocate = std::function<Buffer(Place, int64_t elements, MemoryCategory, DType)>;
  struct Options {
    Placement placement;
    bool on_device = false;       // the layers compute on a device (CUDA), not the CPU
    DType compute = DType::kF32;  // the layers' compute dtype
    bool computes = true;         // false: shape-only, no values move
  };
  // `staging` gives host staging copies (kept by the caller's accounting); `pageable` the
  // gather's short-lived staging of a swapped shard.
  ParamStore(const Options& options, kernels::Ops& ops, Allocator& staging, Allocator& pageable,
             Allocate allocate);
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // The next layer's buffers, as the placement says (layers are added in order).
  void AddLayer(const HeldShape& shape);
  // NVMe: the swapper that holds every layer's shard from now on, and what it needs kept
  // alive until it goes (its I/O engine and swap directory: Note [NVMe offload setup]).
  void SwapTo(std::unique_ptr<ParamSwapper> swapper, std::shared_ptr<const void> needs = {});

  const HeldShape& shape(size_t l) const { return layers_[l].shape; }
  size_t layers() const { return layers_.size(); }
  bool swapped() const { return swapper_ != nullptr; }
  const ParamSwapper* swapper() const { return swapper_.get(); }
  // The fp32 held elements (empty on NVMe) and the compute-dtype copy (empty without one).
  const Buffer& held(size_t l) const { return layers_[l].params; }
  const Buffer& compute_copy(size_t l) const { return layers_[l].lp; }
  // The held elements as fp32 on the device the layers compute on (not on NVMe).
  Tensor HeldTensor(size_t l) const;
  // The optimizer range of HeldTensor(l).
  Tensor OptimizerRange(size_t l) const;

  // Layer l's held elements to and from host memory, the copies done on return.
  void Read(size_t l, float* dst);
  void Write(size_t l, const float* src);
  // A host view of layer l's held elements to change in place: the buffer itself when it is
  // host memory, else a copy in `staged` (from `staging`, under `category`), holding the
  // current values when `current`, zeros otherwise. Commit stores a staged copy back.
  float* OpenOnHost(size_t l, Buffer& staged, MemoryCategory category, bool current);
  void Commit(size_t l, const Buffer& staged);
  // The fp32 master of layer l's optimizer range on the host, for the optimizer to update in
  // place; Release copies or writes it back when `changed`. One layer at a time.
  float* Acquire(size_t l);
  void Release(size_t l, bool changed);
  // Stage 3: the shard layer l's gather sends, for `mine`, the rank's chunk of the gathered
  // buffer (in the gather's dtype, where the gather runs): `mine` itself, with the shard
  // already in it, or the held shard (or its compute copy) to send from. `staged` keeps a
  // staged copy alive until the send has read it.
  Tensor GatherSource(size_t l, const Tensor& mine, Buffer& staged);
  // The compute-dtype copies from the fp32 values (after every update, load or fill).
  void RefreshComputeCopies();
  void Prefetch(size_t l);
  void Flush();
  // Seconds spent waiting for the swapper since construction.
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Layer {
    HeldShape shape;
    Buffer params;  // fp32 held elements (none on NVMe)
    Buffer lp;      // the compute-dtype copy
    Buffer master;  // pinned fp32 master of the optimizer range (device params, host AdamW)
  };
  class Waiting;

  Options options_;
  kernels::Ops& ops_;
  Allocator& staging_;
  Allocator& pageable_;
  Allocate allocate_;
  std::vector<Layer> layers_;
  std::shared_ptr<const void> swapper_needs_;  // outlives swapper_ (declared before it)
  std::unique_ptr<ParamSwapper> swapper_;
  double wait_seconds_ = 0.0;
};

}  // namespace ztrain::offload
