#pragma once
// Causal attention for bf16 and fp16 on tensor cores (Note [Tensor-core attention],
// attention_tc.cu): the same contract as the fp32 kernels of attention.cu (ops.h
// AttentionForward / AttentionBackward; lse [B, NH, T] fp32 saved by the forward), called by
// them for 16-bit dtypes when CudaOpsOptions::tensor_core_attention is set. Arguments are
// checked by the caller; head_size <= 128.
#include <cuda_runtime.h>

#include "kernels/cuda/attention_shape.cuh"

namespace ztrain::kernels::cuda {

// out and lse from qkv. T is __nv_bfloat16 or __half.
template <typename T>
void TcAttentionForward(const T* qkv, T* out, float* lse, const AttentionShape& s,
                        cudaStream_t stream);

// dqkv (every element written) from dout, qkv, the forward's lse and delta[b, h, t] =
// dout . out of that row.
template <typename T>
void TcAttentionBackward(const T* qkv, const T* dout, const float* lse, const float* delta, T* dqkv,
                         const AttentionShape& s, cudaStream_t stream);

}  // namespace ztrain::kernels::cuda
