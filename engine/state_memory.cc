// Note [The engine's memory] is in state_memory.h.
#include "engine/state_memory.h"

#include <cstring>

#include "core/logging.h"
#include "estimate/shape_only.h"
#include "kernels/cuda_memory.h"

namespace ztrain {

StateMemory::StateMemory(Device device, bool computes, kernels::Ops& ops)
    : device_(device),
      computes_(computes),
      on_device_(!device.is_cpu()),
      ops_(ops),
      pinned_tracker_(device.is_cpu() ? &device_tracker_ : &host_tracker_),
      host_(Make(Kind::kHost)),
      locked_(Make(Kind::kLockedHost)),
      device_state_(Make(Kind::kDevice)),
      raw_device_(Make(Kind::kRawDevice)),
      device_pinned_(Make(Kind::kDevicePinned)),
      activations_(*raw_device_, &device_tracker_) {}

// On the CPU backend host memory is the device's. A shape-only set counts the same
// allocations of address space.
std::unique_ptr<Allocator> StateMemory::Make(Kind kind) {
  const bool cpu = device_.is_cpu();
  MemoryTracker* host = cpu ? &device_tracker_ : &host_tracker_;
  if (kind == Kind::kDevicePinned && cpu) return nullptr;
  if (!computes_) {
    const bool on_device = kind == Kind::kDevice || kind == Kind::kRawDevice;
    MemoryTracker* tracker = kind == Kind::kDevice      ? &device_tracker_
                             : kind == Kind::kRawDevice ? nullptr
                             : kind == Kind::kHost      ? host
                                                        : &pinned_tracker_;
    return std::make_unique<detail::ShapeOnlyAllocator>(on_device ? device_ : Device::Cpu(),
                                                        tracker);
  }
  switch (kind) {
    case Kind::kDevice:
      return cpu ? std::make_unique<HostAllocator>(&device_tracker_)
                 : kernels::MakeCudaAllocator(device_.index, &device_tracker_);
    case Kind::kRawDevice:
      return cpu ? std::make_unique<HostAllocator>(nullptr)
                 : kernels::MakeCudaAllocator(device_.index, nullptr);
    case Kind::kHost:
      return std::make_unique<HostAllocator>(host);
    case Kind::kLockedHost:
      return std::make_unique<PinnedHostAllocator>(&pinned_tracker_);
    case Kind::kDevicePinned:
      return kernels::MakeCudaPinnedAllocator(&pinned_tracker_);
  }
  return nullptr;
}

Buffer StateMemory::State(offload::Place where, int64_t elements, MemoryCategory category,
                          DType dtype) {
  using offload::Place;
  Allocator* alloc = device_state_.get();
  if (where == Place::kHost) alloc = host_.get();
  if (where == Place::kPinned) alloc = on_device_ ? device_pinned_.get() : locked_.get();
  ZTRAIN_ASSERT(where != Place::kNvme, "state on NVMe lives in a swapper");
  Buffer b(*alloc, dtype, {elements}, category);
  Zero(b);
  return b;
}

void StateMemory::Zero(const Buffer& b) {
  if (!computes_ || b.nbytes() == 0) return;
  if (b.device().is_cpu()) {
    std::memset(b.data(), 0, b.nbytes());
  } else {
    ops_.Zero(b.AsTensor(DType::kU16, {static_cast<int64_t>(b.nbytes() / 2)}));
  }
}

int64_t StateMemory::unpinned_bytes() const {
  const auto* locked = dynamic_cast<const PinnedHostAllocator*>(locked_.get());
  return device_.is_cpu() && locked ? locked->unpinned_bytes() : 0;
}

}  // namespace ztrain
