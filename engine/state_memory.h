#pragma once
// Note [The engine's memory]
// Every byte the engine allocates comes from one of these allocators, and is counted by
// category in `all()` and by where it lives: the device (on the CPU backend, all of it),
// host memory (on a GPU: offloaded state, staging copies, swap buffers), and the page-locked
// part of host memory (pin_memory state, the swappers' I/O buffers; counted in the device's
// figures on the CPU backend). The allocators:
//   device       model state on the device: host memory on the CPU backend; on CUDA device
//                memory (cudaMallocAsync)
//   activations  activations and per-step buffers, on the device, through a caching
//                allocator over untracked device memory (it counts what is in use)
//   host         host memory: host state (all state on the CPU backend), staging copies,
//                swapped shards
//   pinned       page-locked host memory: offloaded state with pin_memory (mlock on the CPU
//                backend, cudaHostAlloc on CUDA), and the swappers' I/O buffers (mlock)
// A shape-only set (Note [Shape-only engine], estimate/shape_only.h) counts the same
// allocations of address space and holds no data.
#include <cstdint>
#include <memory>

#include "core/allocator.h"
#include "core/buffer.h"
#include "core/caching_allocator.h"
#include "core/memory_tracker.h"
#include "kernels/ops.h"
#include "offload/placement.h"

namespace ztrain {

class StateMemory {
 public:
  // `ops` (not owned; it must outlive this) zeroes device memory.
  StateMemory(Device device, bool computes, kernels::Ops& ops);
  StateMemory(const StateMemory&) = delete;
  StateMemory& operator=(const StateMemory&) = delete;

  MemoryTracker& all() { return all_; }
  const MemoryTracker& all() const { return all_; }
  const MemoryTracker& device() const { return device_tracker_; }
  const MemoryTracker& host() const { return host_tracker_; }
  const MemoryTracker& pinned() const { return pinned_tracker_; }

  // A zeroed buffer of model state where `where` says (not NVMe: a swapper holds that).
  Buffer State(offload::Place where, int64_t elements, MemoryCategory category,
               DType dtype = DType::kF32);
  // Zeroes `b`, wherever it lives (nothing for a shape-only set).
  void Zero(const Buffer& b);

  CachingAllocator& activations() { return activations_; }
  Allocator& host_memory() { return *host_; }
  // Page-locked host memory of the CPU kind (mlock): the swappers' I/O buffers.
  Allocator& locked_host() { return *locked_; }
  // Where host copies of device state are made: host memory on CUDA; on the CPU the caching
  // allocator (its bytes are counted the same way).
  Allocator& staging() { return on_device_ ? *host_ : static_cast<Allocator&>(activations_); }
  // Page-locked host memory a device copies from fastest (cudaHostAlloc); null on the CPU.
  Allocator* device_pinned() { return device_pinned_.get(); }
  // Pinned bytes the CPU kind could not lock (RLIMIT_MEMLOCK too small); 0 on CUDA.
  int64_t unpinned_bytes() const;

 private:
  enum class Kind { kDevice, kRawDevice, kHost, kLockedHost, kDevicePinned };
  std::unique_ptr<Allocator> Make(Kind kind);

  const Device device_;
  const bool computes_;
  const bool on_device_;
  kernels::Ops& ops_;
  MemoryTracker all_;  // the next three add up into it
  MemoryTracker device_tracker_{&all_};
  MemoryTracker host_tracker_{&all_};
  MemoryTracker pinned_tracker_;  // inside host memory (on the CPU backend: the device's)
  std::unique_ptr<Allocator> host_;
  std::unique_ptr<Allocator> locked_;
  std::unique_ptr<Allocator> device_state_;
  std::unique_ptr<Allocator> raw_device_;
  std::unique_ptr<Allocator> device_pinned_;
  CachingAllocator activations_;
};

}  // namespace ztrain
