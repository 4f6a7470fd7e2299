#pragma once
// IoBuffer: an aligned host buffer that file I/O reads into and writes from.
//
// Owns `capacity()` bytes (the size asked for, rounded up to kIoAlignment) from an Allocator,
// counted by its MemoryTracker under a category (swap buffers by default). The memory is
// locked (mlock) where RLIMIT_MEMLOCK allows, so the kernel never pages it out under a
// transfer; pinned() says whether that worked (an unpinned buffer works the same, a little
// slower under memory pressure). The padding past size() is zeroed, so a transfer rounded up
// to the alignment writes zeros, not stale memory, after the data.
// Register(engine) also registers the buffer with an io_uring engine (IoEngine::RegisterBuffer)
// until Reset or destruction; the engine must outlive the buffer.
// From a shape-only allocator (Allocator::holds_data false) the buffer is counted and
// neither zeroed, locked nor registered.
// Move-only; the allocator must return kIoAlignment-aligned memory (HostAllocator does) and
// outlive the buffer. Not thread safe; never touch a buffer while I/O on it is in flight.
#include <cstdint>

#include "core/allocator.h"
#include "core/buffer.h"

namespace ztrain::offload {

class IoEngine;

class IoBuffer {
 public:
  IoBuffer() = default;
  IoBuffer(Allocator& allocator, int64_t bytes,
           MemoryCategory category = MemoryCategory::kSwapBuffers);
  ~IoBuffer() { Reset(); }
  IoBuffer(IoBuffer&& other) noexcept { *this = std::move(other); }
  IoBuffer& operator=(IoBuffer&& other) noexcept;
  IoBuffer(const IoBuffer&) = delete;
  IoBuffer& operator=(const IoBuffer&) = delete;

  char* data() const { return buffer_.data<char>(); }
  int64_t size() const { return size_; }
  int64_t capacity() const { return static_cast<int64_t>(buffer_.nbytes()); }
  bool pinned() const { return pinned_; }
  // Registers the buffer with `engine` for fixed-buffer I/O (at most one engine at a time);
  // returns registered(). A buffer that cannot be registered works as before.
  bool Register(IoEngine& engine);
  bool registered() const { return slot_ >= 0; }
  void Reset() noexcept;

 private:
  void Unregister() noexcept;

  Buffer buffer_;
  int64_t size_ = 0;
  bool pinned_ = false;
  IoEngine* engine_ = nullptr;  // where the buffer is registered, with slot_ >= 0
  int slot_ = -1;
};

}  // namespace ztrain::offload
