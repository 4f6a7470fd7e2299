#pragma once
// Allocators: where a Buffer's bytes come from.
//
// An Allocator hands out raw memory for one device and reports every allocation, by
// category, to the MemoryTracker it was given (which must outlive it). Allocate throws
// OutOfMemoryError naming the size and category; Free never throws. HostAllocator is thread
// safe. Pinned-host and CUDA allocators live with the CUDA backend.
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

}  // namespace ztrain
