#pragma once
// CachingAllocator: keeps freed blocks for reuse, so the activations and workspace of one
// train step reuse the memory of the previous step instead of mapping and faulting in fresh
// pages every time (as PyTorch's caching allocator does).
//
// Takes raw blocks from an upstream Allocator that has no tracker of its own, and reports
// bytes IN USE, per category, to `tracker`; reserved() adds the cached free blocks. Blocks are
// reused on an exact size match (a step allocates the same sizes every time). Thread safe.
// EmptyCache() returns cached blocks upstream.
#include <map>
#include <mutex>
#include <vector>

#include "core/allocator.h"

namespace ztrain {

class CachingAllocator final : public Allocator {
 public:
  CachingAllocator(Allocator& upstream, MemoryTracker* tracker)
      : upstream_(upstream), tracker_(tracker) {}
  ~CachingAllocator() override { EmptyCache(); }
  void* Allocate(size_t bytes, MemoryCategory category) override;
  void Free(void* ptr, size_t bytes, MemoryCategory category) noexcept override;
  Device device() const override { return upstream_.device(); }
  MemoryTracker* tracker() const override { return tracker_; }
  bool holds_data() const override { return upstream_.holds_data(); }
  void EmptyCache() noexcept;
  // Bytes held from upstream, in use or cached.
  size_t reserved() const;

 private:
  Allocator& upstream_;
  MemoryTracker* tracker_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // size -> block
  size_t cached_bytes_ = 0;
  size_t in_use_bytes_ = 0;
};

}  // namespace ztrain
