#pragma once
// Argument checks shared by the CPU kernels. Each throws ztrain::Error whose message starts
// with "<op>: <argument>" and says what was expected, so a caller can fix the call.
#include <cstdint>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace ztrain::kernels::cpu {

// Elements below which an elementwise loop runs on one thread (threads cost more).
inline constexpr int64_t kParallelGrain = int64_t{1} << 15;

// t is defined, on the CPU and of `dtype` (fp32 by default: the fp32 kernels' own check, and
// the check of the arguments ops.h fixes as fp32, so the message names the wrong dtype).
void CheckCpu(const Tensor& t, const char* op, const char* what, DType dtype = DType::kF32);
// CheckCpu plus an exact shape.
void CheckCpu(const Tensor& t, const Shape& shape, const char* op, const char* what,
              DType dtype = DType::kF32);
// t is defined, on the CPU and of a floating-point dtype: fp32, bf16 or fp16 (the ops that
// run through the widening adapter check their float arguments with these first).
void CheckCpuFloat(const Tensor& t, const char* op, const char* what);
void CheckCpuFloat(const Tensor& t, const Shape& shape, const char* op, const char* what);
// t is [..., cols] with at least one dimension; returns the number of rows (numel / cols).
int64_t RowsOf(const Tensor& t, int64_t cols, const char* op, const char* what,
               DType dtype = DType::kF32);
// t's shape with its last dimension replaced by `cols`.
Shape WithLastDim(const Shape& shape, int64_t cols);
// t holds exactly `count` elements of `dtype` (any shape: [N] or [B, T] both pass).
void CheckCount(const Tensor& t, int64_t count, const char* op, const char* what,
                DType dtype = DType::kF32);

// The heads of an attention-shaped op (ops.h's AttentionHeads): positive counts,
// num_kv_heads dividing num_heads, a positive head_dim.
void CheckHeads(const AttentionHeads& heads, const char* op);
// t (its device and dtype checked already) is [B, T, (NH + 2 * NKV) * HS], the qkv layout of
// ops.h; the heads are checked once t is known to be 3-D.
void CheckQkvShape(const Tensor& t, const AttentionHeads& heads, const char* op, const char* what);

}  // namespace ztrain::kernels::cpu
