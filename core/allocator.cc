#include "core/allocator.h"

#include <sys/mman.h>

#include <cstdlib>

#include "core/error.h"

namespace ztrain {

void* HostAllocator::Allocate(size_t bytes, MemoryCategory category) {
  if (bytes == 0) return nullptr;
  const size_t rounded = (bytes + alignment_ - 1) / alignment_ * alignment_;
  void* p = std::aligned_alloc(alignment_, rounded);
  ZTRAIN_CHECK_T(OutOfMemoryError, p != nullptr, "out of host memory allocating ",
                 FormatBytes(static_cast<int64_t>(bytes)), " for ",
                 MemoryCategoryName(category), "; reduce the batch or model size");
  if (tracker_) tracker_->Allocated(category, static_cast<int64_t>(bytes));
  return p;
}

void HostAllocator::Free(void* ptr, size_t bytes, MemoryCategory category) noexcept {
  if (ptr == nullptr) return;
  std::free(ptr);
  if (tracker_) tracker_->Freed(category, static_cast<int64_t>(bytes));
}

void* PinnedHostAllocator::Allocate(size_t bytes, MemoryCategory category) {
  void* p = host_.Allocate(bytes, category);
  if (p == nullptr) return p;
  if (mlock(p, bytes) == 0) {
    pinned_ += static_cast<int64_t>(bytes);
  } else {
    unpinned_ += static_cast<int64_t>(bytes);
  }
  return p;
}

void PinnedHostAllocator::Free(void* ptr, size_t bytes, MemoryCategory category) noexcept {
  if (ptr == nullptr) return;
  // munlock of pages that were never locked is harmless; the counters cannot tell which.
  munlock(ptr, bytes);
  host_.Free(ptr, bytes, category);
}

}  // namespace ztrain
