#pragma once
// Allocators: where a Buffer's bytes come from.
//
// An Allocator hands out raw memory for one device and reports every allocation, by
// category, to the MemoryTracker it was given (which must outlive it). Allocate throws
// OutOfMemoryError naming the size and category; Free never throws. HostAllocator is thread
// safe. PinnedHostAllocator locks its pages (mlock) for offloaded state; CUDA allocators live
// with the CUDA backend.
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/device.h"
#include "core/memory_tracker.h"

namespace ztrain {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* Allocate(size_t bytes, MemoryCategory category) = 0;
  virtual void Free(void* ptr, size_t bytes, MemoryCategory category) noexcept = 0;
  virtual Device device() const = 0;
  virtual MemoryTracker* tracker() const = 0;
  // False for a shape-only allocator (the memory estimate's, Note [Shape-only engine] in
  // estimate/shape_only.h): its blocks are address space that holds no data, counted as real
  // ones. Code that would fill, copy or lock such a block skips it (Buffer::Zero, I/O
  // buffers and swap files, the engine's host-side arithmetic).
  virtual bool holds_data() const { return true; }
};

// Host memory aligned to `alignment` bytes (default 4096: whole pages, good for SIMD and for
// O_DIRECT I/O). Memory is not initialised.
class HostAllocator final : public Allocator {
 public:
  explicit HostAllocator(MemoryTracker* tracker, size_t alignment = 4096)
      : tracker_(tracker), alignment_(alignment) {}
  void* Allocate(size_t bytes, MemoryCategory category) override;
  void Free(void* ptr, size_t bytes, MemoryCategory category) noexcept override;
  Device device() const override { return Device::Cpu(); }
  MemoryTracker* tracker() const override { return tracker_; }

 private:
  MemoryTracker* tracker_;
  size_t alignment_;
};

// Page-locked host memory (ZeRO-Offload's `pin_memory`): HostAllocator's memory, mlock'ed so
// the kernel never pages it out. Where RLIMIT_MEMLOCK is too small the memory stays pageable
// (it works the same, only slower under memory pressure); pinned_bytes() and
// unpinned_bytes() say how it went. Thread safe.
class PinnedHostAllocator final : public Allocator {
 public:
  explicit PinnedHostAllocator(MemoryTracker* tracker) : host_(tracker) {}
  void* Allocate(size_t bytes, MemoryCategory category) override;
  void Free(void* ptr, size_t bytes, MemoryCategory category) noexcept override;
  Device device() const override { return Device::Cpu(); }
  MemoryTracker* tracker() const override { return host_.tracker(); }
  int64_t pinned_bytes() const { return pinned_.load(); }
  int64_t unpinned_bytes() const { return unpinned_.load(); }

 private:
  HostAllocator host_;
  std::atomic<int64_t> pinned_{0}, unpinned_{0};
};

}  // namespace ztrain
