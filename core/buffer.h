#pragma once
// Buffer: RAII owner of one allocation from an Allocator, tagged with a MemoryCategory.
//
// Move-only. The allocator must outlive the buffer. Destruction frees and un-counts the
// bytes; it never throws.
#include <cstddef>

#include "core/allocator.h"
#include "core/tensor.h"

namespace ztrain {

class Buffer {
 public:
  Buffer() = default;
  Buffer(Allocator& allocator, size_t bytes, MemoryCategory category);
  // A buffer holding `shape` elements of `dtype`.
  Buffer(Allocator& allocator, DType dtype, const Shape& shape, MemoryCategory category);
  ~Buffer() { Reset(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }
  size_t nbytes() const { return bytes_; }
  MemoryCategory category() const { return category_; }
  Device device() const { return allocator_ ? allocator_->device() : Device::Cpu(); }
  // False when the allocator is shape-only (Allocator::holds_data): nothing to read or write.
  bool holds_data() const { return allocator_ == nullptr || allocator_->holds_data(); }
  // A view of the first numel(shape) elements as `dtype`.
  Tensor AsTensor(DType dtype, Shape shape) const;
  // Sets every byte to zero (host buffers; nothing for a shape-only one).
  void Zero();
  void Reset() noexcept;

 private:
  Allocator* allocator_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemoryCategory category_ = MemoryCategory::kWorkspace;
};

}  // namespace ztrain
