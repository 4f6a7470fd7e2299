#include "kernels/cuda/arg_check.h"

#include <climits>

namespace ztrain::kernels::cuda {

void CheckOnDevice(const Tensor& t, Device device, const char* op, const char* what) {
  ZTRAIN_CHECK(t.defined(), op, ": ", what, " is undefined; pass a tensor");
  ZTRAIN_CHECK(t.device() == device, op, ": ", what, " is on ", t.device().ToString(),
               ", expected ", device.ToString(), " (the ops' device)");
}

void CheckOnDevice(const Tensor& t, Device device, DType dtype, const char* op,
                   const char* what) {
  CheckOnDevice(t, device, op, what);
  ZTRAIN_CHECK(t.dtype() == dtype, op, ": ", what, " has dtype ", DTypeName(t.dtype()),
               ", expected ", DTypeName(dtype));
}

void CheckOnDevice(const Tensor& t, Device device, DType dtype, const Shape& shape,
                   const char* op, const char* what) {
  CheckOnDevice(t, device, dtype, op, what);
  ZTRAIN_CHECK(t.shape() == shape, op, ": ", what, " has shape ", ShapeToString(t.shape()),
               ", expected ", ShapeToString(shape));
}

void CheckFloat(const Tensor& t, Device device, const char* op, const char* what) {
  CheckOnDevice(t, device, op, what);
  ZTRAIN_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16,
               op, ": ", what, " has dtype ", DTypeName(t.dtype()),
               "; the CUDA kernels take fp32, bf16 or fp16 tensors");
}

void CheckLike(const Tensor& t, const Tensor& ref, const char* op, const char* what) {
  CheckOnDevice(t, ref.device(), ref.dtype(), ref.shape(), op, what);
}

void CheckGrad(const Tensor& t, const Tensor& ref, const char* op, const char* what) {
  CheckOnDevice(t, ref.device(), t.dtype() == DType::kF32 ? DType::kF32 : ref.dtype(),
                ref.shape(), op, what);
}

int64_t RowsOf(const Tensor& t, int64_t cols, const char* op, const char* what) {
  ZTRAIN_CHECK(t.dim() >= 1 && t.size(-1) == cols, op, ": ", what, " has shape ",
               ShapeToString(t.shape()), ", expected [..., ", cols, "]");
  return cols == 0 ? 0 : t.numel() / cols;
}

void CheckCount(const Tensor& t, int64_t count, const char* op, const char* what) {
  ZTRAIN_CHECK(t.numel() == count, op, ": ", what, " has shape ", ShapeToString(t.shape()),
               " (", t.numel(), " elements), expected ", count, " elements");
}

void CheckQkv(const Tensor& qkv, const AttentionHeads& heads, Device device, const char* op,
              const char* what) {
  CheckFloat(qkv, device, op, what);
  ZTRAIN_CHECK(heads.num_heads > 0 && heads.num_kv_heads > 0 && heads.head_dim > 0, op,
               ": heads has num_heads = ", heads.num_heads, ", num_kv_heads = ",
               heads.num_kv_heads, ", head_dim = ", heads.head_dim, " for ", what, " ",
               ShapeToString(qkv.shape()), "; all must be positive");
  ZTRAIN_CHECK(heads.num_heads % heads.num_kv_heads == 0, op, ": num_kv_heads = ",
               heads.num_kv_heads, " must divide num_heads = ", heads.num_heads);
  ZTRAIN_CHECK(qkv.dim() == 3 && qkv.size(2) == heads.qkv_width(), op, ": ", what,
               " has shape ", ShapeToString(qkv.shape()), ", expected [B, T, ",
               heads.qkv_width(), "] ((num_heads + 2 num_kv_heads) head_dim = (",
               heads.num_heads, " + 2 * ", heads.num_kv_heads, ") * ", heads.head_dim, ")");
}

int CheckInt32(int64_t d, const char* op, const char* what) {
  ZTRAIN_CHECK(d >= 0 && d <= INT_MAX, op, ": ", what, " = ", d,
               " exceeds the 32-bit range the CUDA kernels index with");
  return static_cast<int>(d);
}

}  // namespace ztrain::kernels::cuda
