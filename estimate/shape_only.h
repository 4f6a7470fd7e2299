#pragma once
// What a shape-only Engine runs on (Engine::ShapeOnly): kernels that compute nothing, memory
// that is address space holding no data, and groups that move nothing. Private to engine/.
//
// Note [Shape-only engine]
// The memory estimate (estimate/estimate.h) does not model the engine: it runs it. A shape-only
// engine is the real Engine — its constructor, its initialisation walk and one TrainStep, in
// any ZeRO stage, offload, pipeline or tensor-parallel layout — with three things swapped, as
// torchtitan's meta device swaps storage:
//   - ShapeOps: every op returns at once and touches nothing;
//   - ShapeOnlyAllocator: every buffer is an address that holds no data (and faults if
//     touched), counted by the engine's own MemoryTrackers exactly as the real allocators
//     count it, so a 70B model costs no memory. Allocator::holds_data() is false, and the few
//     places that touch host memory themselves skip such buffers: Buffer::Zero, the I/O
//     buffers and swappers (no file, no I/O), and the engine's host arithmetic (AdamW on the
//     host, the gradient norm, initial values, master copies), each guarded by its
//     `computes_`;
//   - ShapeOnlyGroup: the dp, pp and tp groups of the rank's coordinates, whose ops move
//     nothing and finish at once.
// So what the engine allocates, and when it frees it, is what the estimate counts: a change
// to the engine changes the estimate with it, and estimate_test and layout_equivalence_test
// hold the two against each other in every mode.
// Two things a run's memory depends on are not the engine's code, and the estimate supplies
// them: (1) what each layer allocates in Forward and Backward, which the estimate measures by
// running the layer's own code (estimate/estimate_layers.h); (2) how long a pipeline send takes,
// which decides when its buffer is freed: the engine frees a finished send's buffer at the
// start of the next instruction that polls it, and polls every pending send once per
// instruction, so a ShapeOnlyGroup send answers Done() on the poll the estimate names (the
// first instruction that starts after the peer, on pipeline::Simulate's clock, began the
// matching receive). Not modelled: the MPI backend's ring scratch, memory the libraries take
// outside the tracker (the CUDA context, cuBLAS and NCCL workspaces), cached free blocks.
#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "kernels/ops.h"
#include "parallel/comm/communicator.h"

namespace ztrain::detail {

// One allocation or free through a ShapeOnlyAllocator that records them.
struct AllocEvent {
  int64_t bytes = 0;  // of the allocation (the same on its free)
  MemoryCategory category = MemoryCategory::kActivations;
  int id = 0;  // which allocation: numbered from 0 over the allocator's life
  bool free = false;
};

// Blocks for `device` that hold no data, counted in `tracker` (may be null) as HostAllocator
// counts; with set_events, every allocation and free is also recorded in order. Not thread
// safe. Two kinds:
//   kAddresses  4 KiB-aligned addresses outside the address space, never mapped: any access
//               faults at once. Nothing limits their sizes (an estimate of micro-batches past
//               any machine's memory), and they cost nothing. The engine's memory.
//   kMapped     MAP_NORESERVE anonymous mappings: no page is committed unless written. For the
//               layers' probes, whose tensor-parallel host loops write their small tensors. A
//               block past the address space is a ConfigError.
class ShapeOnlyAllocator final : public Allocator {
 public:
  enum class Backing { kAddresses, kMapped };
  ShapeOnlyAllocator(Device device, MemoryTracker* tracker, Backing backing = Backing::kAddresses)
      : device_(device), tracker_(tracker), backing_(backing) {}
  void* Allocate(size_t bytes, MemoryCategory category) override;
  void Free(void* ptr, size_t bytes, MemoryCategory category) noexcept override;
  Device device() const override { return device_; }
  MemoryTracker* tracker() const override { return tracker_; }
  bool holds_data() const override { return false; }
  // Where to record (null: stop recording).
  void set_events(std::vector<AllocEvent>* events) { events_ = events; }

 private:
  Device device_;
  MemoryTracker* tracker_;
  Backing backing_;
  std::vector<AllocEvent>* events_ = nullptr;
  std::unordered_map<void*, int> ids_;
  int next_id_ = 0;
};

// Kernels that compute nothing, for `device`: the callers' code runs with every allocation
// it makes, and no element is read or written.
class ShapeOps final : public kernels::Ops {
 public:
  explicit ShapeOps(Device device) : device_(device) {}
  Device device() const override { return device_; }
  void Gemm(bool, bool, float, const Tensor&, const Tensor&, float, const Tensor&) override {}
  void LinearForward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void MergeAttention(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void LinearBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&) override {}
  using Ops::EmbeddingBackward;
  using Ops::EmbeddingForward;
  void EmbeddingForward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const kernels::VocabSlice&) override {}
  void EmbeddingBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const kernels::VocabSlice&) override {}
  void LayerNormForward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&) override {}
  void LayerNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const Tensor&) override {}
  void RmsNormForward(const Tensor&, const Tensor&, float, const Tensor&, const Tensor&) override {}
  void RmsNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&) override {}
  void AttentionForward(const Tensor&, const kernels::AttentionHeads&,
                        const kernels::AttentionMask&, const Tensor&, const Tensor&) override {}
  void AttentionBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const kernels::AttentionHeads&, const kernels::AttentionMask&,
                         const Tensor&) override {}
  using Ops::RopeBackward;
  using Ops::RopeForward;
  void RopeForward(const Tensor&, const kernels::AttentionHeads&, const Tensor&, int64_t, float,
                   const Tensor&) override {}
  void RopeBackward(const Tensor&, const kernels::AttentionHeads&, const Tensor&, float,
                    const Tensor&) override {}
  void SwiGluForward(const Tensor&, const Tensor&, const Tensor&) override {}
  void SwiGluBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&) override {}
  void GeluForward(const Tensor&, const Tensor&) override {}
  void GeluBackward(const Tensor&, const Tensor&, const Tensor&) override {}
  void Add(const Tensor&, const Tensor&, const Tensor&) override {}
  void AddInPlace(const Tensor&, const Tensor&) override {}
  void AddBiasAndResidual(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void AddColumns(const Tensor&, int64_t, const Tensor&, float) override {}
  void CopyColumns(const Tensor&, int64_t, const Tensor&) override {}
  void Dequantize(const Tensor&, const kernels::QuantFormat&, const kernels::QuantGeometry&,
                  const Tensor&) override {}
  void Dropout(const Tensor&, const kernels::DropoutMask&, const Tensor&) override {}
  void Zero(const Tensor&) override {}
  void Copy(const Tensor&, const Tensor&) override {}
  void Synchronize() override {}
  void SoftmaxCrossEntropy(const Tensor&, const Tensor&, int64_t, const Tensor&,
                           const Tensor&) override {}
  void VocabParallelCrossEntropy(kernels::CrossEntropyStep, const Tensor&, const Tensor&,
                                 const kernels::VocabSlice&, const Tensor&,
                                 const Tensor&) override {}
  void VocabParallelCrossEntropyBackward(const Tensor&, const Tensor&, const kernels::VocabSlice&,
                                         const Tensor&, const Tensor&) override {}
  double SumSquares(const Tensor&) override { return 0.0; }
  void Scale(const Tensor&, float) override {}

 private:
  Device device_;
};

// A group of `size` ranks seen from rank `rank`, whose ops move nothing and finish at once;
// Split is an internal error. Send k (counted from 0 over the group's life) answers Done()
// on its send_polls[k]-th call (Note [Shape-only engine]; a value <= 0 means never, until
// Wait); sends past the list are done at once.
class ShapeOnlyGroup final : public comm::Communicator {
 public:
  ShapeOnlyGroup(int size, int rank, std::vector<int> send_polls = {})
      : size_(size), rank_(rank), send_polls_(std::move(send_polls)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "shape-only group of " + std::to_string(size_); }
  void set_label(const std::string&) override {}
  std::chrono::milliseconds timeout() const override { return {}; }
  void set_timeout(std::chrono::milliseconds) override {}
  comm::WorkPtr AllReduce(const Tensor&, comm::ReduceOp) override { return Finished(); }
  comm::WorkPtr ReduceScatter(const Tensor&, const Tensor&, comm::ReduceOp) override {
    return Finished();
  }
  comm::WorkPtr AllGather(const Tensor&, const Tensor&) override { return Finished(); }
  comm::WorkPtr AllToAll(const Tensor&, const Tensor&) override { return Finished(); }
  comm::WorkPtr Broadcast(const Tensor&, int) override { return Finished(); }
  comm::WorkPtr Send(const Tensor&, int, int) override;
  comm::WorkPtr Recv(const Tensor&, int, int) override { return Finished(); }
  comm::WorkPtr Barrier() override { return Finished(); }
  std::unique_ptr<comm::Communicator> Split(int, int) override;
  comm::CommStats stats() const override { return {}; }

 private:
  static comm::WorkPtr Finished();
  int size_;
  int rank_;
  std::vector<int> send_polls_;
  size_t sends_ = 0;
};

}  // namespace ztrain::detail
