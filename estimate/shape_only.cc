// The shape-only engine's device, memory and groups (Note [Shape-only engine]).
#include "estimate/shape_only.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>

#include "core/error.h"

namespace ztrain::detail {
namespace {

// An op that finishes on its n-th Done(), and stays finished (never before Wait when
// n <= 0).
class PolledWork final : public comm::Work {
 public:
  explicit PolledWork(int polls) : left_(polls > 0 ? polls : -1) {}
  void Wait() override { left_ = 0; }
  bool Done() override {
    if (left_ > 0) --left_;
    return left_ == 0;
  }

 private:
  int left_;
};

}  // namespace

void* ShapeOnlyAllocator::Allocate(size_t bytes, MemoryCategory category) {
  if (bytes == 0) return nullptr;  // as HostAllocator: nothing counted
  void* p = nullptr;
  if (backing_ == Backing::kAddresses) {
    // Above 2^62: non-canonical on x86-64 (4- and 5-level paging) and outside every user
    // address space. One counter for every allocator, so that no two live blocks share an
    // address (should 2^50 pages ever be handed out, it wraps: only live blocks must differ).
    static std::atomic<uint64_t> next_page{0};
    constexpr uint64_t kBase = uint64_t{1} << 62, kPage = 4096;
    const uint64_t page = next_page.fetch_add((bytes + kPage - 1) / kPage);
    p = reinterpret_cast<void*>(kBase | (page * kPage % kBase));
  } else {
    p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
               -1, 0);
    ZTRAIN_CHECK_T(ConfigError, p != MAP_FAILED, "the memory estimate cannot map ",
                   FormatBytes(static_cast<int64_t>(bytes)), " of address space for a layer's ",
                   MemoryCategoryName(category), "; lower the micro-batch or sequence length");
  }
  if (tracker_) tracker_->Allocated(category, static_cast<int64_t>(bytes));
  if (events_) {
    ids_[p] = next_id_;
    events_->push_back({static_cast<int64_t>(bytes), category, next_id_, false});
  }
  ++next_id_;
  return p;
}

void ShapeOnlyAllocator::Free(void* ptr, size_t bytes, MemoryCategory category) noexcept {
  if (ptr == nullptr) return;
  if (events_) {
    auto it = ids_.find(ptr);
    if (it != ids_.end()) {
      events_->push_back({static_cast<int64_t>(bytes), category, it->second, true});
      ids_.erase(it);
    }
  }
  if (backing_ == Backing::kMapped) ::munmap(ptr, bytes);
  if (tracker_) tracker_->Freed(category, static_cast<int64_t>(bytes));
}

comm::WorkPtr ShapeOnlyGroup::Finished() { return std::make_shared<PolledWork>(1); }

comm::WorkPtr ShapeOnlyGroup::Send(const Tensor&, int, int) {
  const size_t k = sends_++;
  if (k >= send_polls_.size()) return Finished();
  return std::make_shared<PolledWork>(send_polls_[k]);
}

std::unique_ptr<comm::Communicator> ShapeOnlyGroup::Split(int, int) {
  ZTRAIN_ASSERT(false, "a shape-only group does not split");
  return nullptr;
}

}  // namespace ztrain::detail
