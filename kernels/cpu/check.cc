#include "kernels/cpu/check.h"

namespace ztrain::kernels::cpu {

void CheckCpu(const Tensor& t, const char* op, const char* what, DType dtype) {
  ZTRAIN_CHECK(t.defined(), op, ": ", what, " is undefined; pass a tensor");
  ZTRAIN_CHECK(t.device().is_cpu(), op, ": ", what, " is on ", t.device().ToString(),
               "; the CPU ops need host tensors");
  const bool half = t.dtype() == DType::kBF16 || t.dtype() == DType::kF16;
  ZTRAIN_CHECK(t.dtype() == dtype, op, ": ", what, " has dtype ", DTypeName(t.dtype()),
               ", expected ", DTypeName(dtype),
               half ? " (the CPU backend has no bf16/fp16 kernels yet)" : "");
}

void CheckCpu(const Tensor& t, const Shape& shape, const char* op, const char* what,
              DType dtype) {
  CheckCpu(t, op, what, dtype);
  ZTRAIN_CHECK(t.shape() == shape, op, ": ", what, " has shape ", ShapeToString(t.shape()),
               ", expected ", ShapeToString(shape));
}

int64_t RowsOf(const Tensor& t, int64_t cols, const char* op, const char* what, DType dtype) {
  CheckCpu(t, op, what, dtype);
  ZTRAIN_CHECK(t.dim() >= 1 && t.size(-1) == cols, op, ": ", what, " has shape ",
               ShapeToString(t.shape()), ", expected [..., ", cols, "]");
  return cols == 0 ? 0 : t.numel() / cols;
}

Shape WithLastDim(const Shape& shape, int64_t cols) {
  Shape s = shape;
  if (!s.empty()) s.back() = cols;
  return s;
}

void CheckCount(const Tensor& t, int64_t count, const char* op, const char* what, DType dtype) {
  CheckCpu(t, op, what, dtype);
  ZTRAIN_CHECK(t.numel() == count, op, ": ", what, " has shape ", ShapeToString(t.shape()),
               " (", t.numel(), " elements), expected ", count, " elements");
}

}  // namespace ztrain::kernels::cpu
