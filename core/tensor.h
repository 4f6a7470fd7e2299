#pragma once
// Tensor: a non-owning, contiguous, row-major view (data, dtype, shape, device).
//
// A Tensor never owns memory: Buffers (and the engine's flat parameter buffers) do, and
// views must not outlive them. Copying a Tensor copies the view, not the data. Not thread
// safe beyond what plain pointers are.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace ztrain {

using Shape = std::vector<int64_t>;
int64_t NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  Tensor(void* data, DType dtype, Shape shape, Device device = Device::Cpu())
      : data_(data), dtype_(dtype), shape_(std::move(shape)), device_(device) {}

  void* data() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  Device device() const { return device_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const { return shape_.at(d < 0 ? d + dim() : d); }
  int64_t numel() const { return NumElements(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }

  // The same data seen with another shape of equal element count.
  Tensor View(Shape shape) const;
  // Rows [begin, end) along dimension 0.
  Tensor Slice(int64_t begin, int64_t end) const;
  // Elements [offset, offset + count) seen as a tensor of `shape` (numel must be count).
  Tensor Flat(int64_t offset, Shape shape) const;
  std::string ToString() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Device device_;
};

// Checks for kernels and layers: dtype and shape, with a message naming `what` (backends
// check the device themselves).
void CheckTensor(const Tensor& t, DType dtype, const Shape& shape, const char* what);

}  // namespace ztrain
