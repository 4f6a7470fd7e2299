#pragma once
// Argument checks for the CUDA ops, run on the host before anything is enqueued (so a
// throwing op has launched nothing). Each throws ztrain::Error whose message starts with
// "<op>: <argument>" and says what was expected, as kernels/cpu/check.h does for the CPU.
#include <cstdint>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace ztrain::kernels::cuda {

// t is defined and lives on `device`.
void CheckOnDevice(const Tensor& t, Device device, const char* op, const char* what);
// CheckOnDevice plus a dtype.
void CheckOnDevice(const Tensor& t, Device device, DType dtype, const char* op,
                   const char* what);
// CheckOnDevice plus dtype and an exact shape.
void CheckOnDevice(const Tensor& t, Device device, DType dtype, const Shape& shape,
                   const char* op, const char* what);
// CheckOnDevice, and the dtype is a floating-point one (fp32, bf16 or fp16).
void CheckFloat(const Tensor& t, Device device, const char* op, const char* what);
// t has ref's device, dtype and shape.
void CheckLike(const Tensor& t, const Tensor& ref, const char* op, const char* what);
// An accumulated parameter gradient: t has ref's device and shape, and ref's dtype or fp32
// (Note [Mixed dtypes on CUDA] in widen.h).
void CheckGrad(const Tensor& t, const Tensor& ref, const char* op, const char* what);
// t (already checked) is [..., cols] with at least one dimension; returns numel / cols.
int64_t RowsOf(const Tensor& t, int64_t cols, const char* op, const char* what);
// t (already checked) holds exactly `count` elements, any shape.
void CheckCount(const Tensor& t, int64_t count, const char* op, const char* what);
// heads is well formed (positive counts and head_dim, num_kv_heads dividing num_heads) and
// qkv (CheckFloat) is [B, T, (NH + 2 NKV) HS] for it (ops.h, AttentionForward).
void CheckQkv(const Tensor& qkv, const AttentionHeads& heads, Device device, const char* op,
              const char* what);
// The kernels index rows and grids with 32-bit ints where noted: d must fit.
int CheckInt32(int64_t d, const char* op, const char* what);

}  // namespace ztrain::kernels::cuda
