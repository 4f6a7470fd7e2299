#include "core/caching_allocator.h"

#include "core/error.h"

namespace ztrain {

// The tracker counts bytes in use: a block leaving the cache is counted again under the
// category that now uses it, and a block entering the cache is un-counted.
void* CachingAllocator::Allocate(size_t bytes, MemoryCategory category) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      p = it->second;
      free_.erase(it);
      cached_bytes_ -= bytes;
      in_use_bytes_ += bytes;
    }
  }
  if (p == nullptr) {
    ZTRAIN_ASSERT(upstream_.tracker() == nullptr, "caching allocator upstream must be untracked");
    p = upstream_.Allocate(bytes, category);
    std::lock_guard<std::mutex> lock(mu_);
    in_use_bytes_ += bytes;
  }
  if (auto* t = tracker()) t->Allocated(category, static_cast<int64_t>(bytes));
  return p;
}

void CachingAllocator::Free(void* ptr, size_t bytes, MemoryCategory category) noexcept {
  if (ptr == nullptr) return;
  if (auto* t = tracker()) t->Freed(category, static_cast<int64_t>(bytes));
  std::lock_guard<std::mutex> lock(mu_);
  free_.emplace(bytes, ptr);
  cached_bytes_ += bytes;
  in_use_bytes_ -= bytes;
}

void CachingAllocator::EmptyCache() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [bytes, p] : free_) {
    upstream_.Free(p, bytes, MemoryCategory::kWorkspace);
  }
  free_.clear();
  cached_bytes_ = 0;
}

size_t CachingAllocator::reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_ + in_use_bytes_;
}

}  // namespace ztrain
