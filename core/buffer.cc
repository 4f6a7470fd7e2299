#include "core/buffer.h"

#include <cstring>

namespace ztrain {

Buffer::Buffer(Allocator& allocator, size_t bytes, MemoryCategory category)
    : allocator_(&allocator), bytes_(bytes), category_(category) {
  data_ = allocator.Allocate(bytes, category);
}

Buffer::Buffer(Allocator& allocator, DType dtype, const Shape& shape, MemoryCategory category)
    : Buffer(allocator, static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype), category) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    allocator_ = other.allocator_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    category_ = other.category_;
    other.allocator_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Tensor Buffer::AsTensor(DType dtype, Shape shape) const {
  ZTRAIN_ASSERT(static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype) <= bytes_,
                "tensor ", ShapeToString(shape), " does not fit a buffer of ", bytes_, " bytes");
  return Tensor(data_, dtype, std::move(shape), device());
}

void Buffer::Zero() {
  ZTRAIN_ASSERT(device().is_cpu());
  if (data_ && holds_data()) std::memset(data_, 0, bytes_);
}

void Buffer::Reset() noexcept {
  if (allocator_ && data_) allocator_->Free(data_, bytes_, category_);
  allocator_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace ztrain
