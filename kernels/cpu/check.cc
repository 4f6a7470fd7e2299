#include "kernels/cpu/check.h"

#include <string>

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

void CheckHeads(const AttentionHeads& h, const char* op) {
  ZTRAIN_CHECK(h.num_heads > 0, op, ": num_heads = ", h.num_heads, " must be positive");
  ZTRAIN_CHECK(h.num_kv_heads > 0 && h.num_heads % h.num_kv_heads == 0, op,
               ": num_kv_heads = ", h.num_kv_heads,
               " must be positive and divide num_heads = ", h.num_heads,
               " (each KV head serves num_heads / num_kv_heads query heads)");
  ZTRAIN_CHECK(h.head_dim > 0, op, ": head_dim = ", h.head_dim, " must be positive");
}

void CheckQkvShape(const Tensor& t, const AttentionHeads& h, const char* op, const char* what) {
  ZTRAIN_CHECK(t.dim() == 3, op, ": ", what, " has shape ", ShapeToString(t.shape()),
               ", expected [B, T, (num_heads + 2 * num_kv_heads) * head_dim]");
  CheckHeads(h, op);
  if (t.size(2) == h.qkv_width()) return;
  // GPT-2's form derives head_dim from C (AttentionHeads::MultiHead): say what does not divide.
  const int64_t width = t.size(2);
  const bool multi_head_misfit =
      h.num_kv_heads == h.num_heads && width % 3 == 0 && (width / 3) % h.num_heads != 0;
  ZTRAIN_CHECK(false, op, ": ", what, " has shape ", ShapeToString(t.shape()),
               ", expected [B, T, (num_heads + 2 * num_kv_heads) * head_dim] = [B, T, ",
               h.qkv_width(), "] for num_heads = ", h.num_heads,
               ", num_kv_heads = ", h.num_kv_heads, ", head_dim = ", h.head_dim,
               multi_head_misfit ? "; multi-head attention needs num_heads to divide C = " : "",
               multi_head_misfit ? std::to_string(width / 3) : "");
}

}  // namespace ztrain::kernels::cpu
