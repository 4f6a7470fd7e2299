#include "kernels/cpu/check.h"

#include "kernels/cpu/convert.h"

namespace ztrain::kernels::cpu {

void CheckCpu(const Tensor& t, const char* op, const char* what, DType dtype) {
  ZTRAIN_CHECK(t.defined(), op, ": ", what, " is undefined; pass a tensor");
  ZTRAIN_CHECK(t.device().is_cpu(), op, ": ", what, " is on ", t.device().ToString(),
               "; the CPU ops need host tensors");
  // A 16-bit tensor reaches this check only where ops.h fixes the argument as fp32: every
  // other one was widened first (Note [Widening adapter] in widen.h).
  const bool half = IsHalfType(t.dtype()) && dtype == DType::kF32;
  ZTRAIN_CHECK(t.dtype() == dtype, op, ": ", what, " has dtype ", DTypeName(t.dtype()),
               ", expected ", DTypeName(dtype), half ? " (ops.h fixes this argument as fp32)" : "");
}

void CheckCpuFloat(const Tensor& t, const char* op, const char* what) {
  ZTRAIN_CHECK(t.defined(), op, ": ", what, " is undefined; pass a tensor");
  ZTRAIN_CHECK(t.device().is_cpu(), op, ": ", what, " is on ", t.device().ToString(),
               "; the CPU ops need host tensors");
  ZTRAIN_CHECK(IsFloatType(t.dtype()), op, ": ", what, " has dtype ", DTypeName(t.dtype()),
               ", expected fp32, bf16 or fp16");
}

void CheckCpuFloat(const Tensor& t, const Shape& shape, const char* op, const char* what) {
  CheckCpuFloat(t, op, what);
  ZTRAIN_CHECK(t.shape() == shape, op, ": ", what, " has shape ", ShapeToString(t.shape()),
               ", expected ", ShapeToString(shape));
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
