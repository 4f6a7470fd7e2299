#include "core/tensor.h"

namespace ztrain {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Tensor Tensor::View(Shape shape) const {
  ZTRAIN_ASSERT(NumElements(shape) == numel(), "view ", ShapeToString(shape), " of ",
                ShapeToString(shape_));
  return Tensor(data_, dtype_, std::move(shape), device_);
}

Tensor Tensor::Slice(int64_t begin, int64_t end) const {
  ZTRAIN_ASSERT(dim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0]);
  Shape s = shape_;
  s[0] = end - begin;
  const int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  return Tensor(static_cast<char*>(data_) + begin * row * DTypeSize(dtype_), dtype_, s, device_);
}

Tensor Tensor::Flat(int64_t offset, Shape shape) const {
  ZTRAIN_ASSERT(offset >= 0 && offset + NumElements(shape) <= numel());
  return Tensor(static_cast<char*>(data_) + offset * DTypeSize(dtype_), dtype_, std::move(shape),
                device_);
}

std::string Tensor::ToString() const {
  return std::string(DTypeName(dtype_)) + ShapeToString(shape_) + "@" + device_.ToString();
}

void CheckTensor(const Tensor& t, DType dtype, const Shape& shape, const char* what) {
  ZTRAIN_CHECK(t.dtype() == dtype && t.shape() == shape, what, ": expected ", DTypeName(dtype),
               ShapeToString(shape), ", got ", t.ToString());
}

}  // namespace ztrain
