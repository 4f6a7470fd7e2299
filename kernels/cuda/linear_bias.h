#pragma once
// The bias side of the linear layer on the GPU (kernels/cuda/linear_bias.cu), called by
// kernels/cuda/gemm.cc: the bias gradient as a deterministic column sum (two passes through
// a float scratch, never atomics), and the bias broadcast for the degenerate C = 0 layer.
// Arguments are checked by the caller; everything is enqueued on `stream`.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace ztrain::kernels::cuda {

// Bytes of scratch AccumulateColumnSums needs for a [rows, cols] dy.
size_t ColumnSumsScratchBytes(int64_t rows, int64_t cols);
// dbias[c] += sum over r of dy[r, c], dy [rows, cols] (fp32, bf16 or fp16) and dbias [cols] of
// dy's dtype or fp32, summed in fp32 in an order fixed by the shape. `scratch` holds
// ColumnSumsScratchBytes.
void AccumulateColumnSums(const Tensor& dy, int64_t rows, int64_t cols, const Tensor& dbias,
                          void* scratch, cudaStream_t stream);
// y[r, c] = bias[c] for every row of y [rows, cols].
void BroadcastRows(const Tensor& bias, int64_t rows, int64_t cols, const Tensor& y,
                   cudaStream_t stream);

}  // namespace ztrain::kernels::cuda
