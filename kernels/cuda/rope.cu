// Rotary position embedding (rotate-half, ops.h RopeForward) in place on the query and key
// heads of qkv, fp32, bf16 or fp16, with fp32 inv_freq [HS/2].
//
// One thread per (row b*T + t, pair i < HS/2): it takes the angle t * inv_freq[i] as the fp32
// product (t: the row's entry of the per-token positions when given), cosf and sinf of it (the
// accurate functions, not the __cosf/__sinf intrinsics, whose error grows with the angle:
// positions reach thousands of radians), and turns pair i of every
// query and key head of the row (NH + NKV heads: they sit side by side at the start of the
// row), so the trigonometry is paid once per (t, i), not once per head. The backward turns by
// the negative angle (sin(-a) = -sin(a) exactly). Consecutive threads take consecutive i, so
// both halves of a head are read and written coalesced. v is never touched.
#include <cmath>

#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"

namespace ztrain::kernels::cuda {
namespace {

struct RopeDims {
  int64_t rows, seq, stride;  // rows = B*T; stride = the qkv row width
  int heads, half, head_dim;  // heads = NH + NKV (the rotated ones)
  int64_t first_position;     // of row t = 0 (incremental decoding)
  const int32_t* positions;   // per row (packed documents), or null: first_position + t
};

// sign = 1 turns by +a (forward), -1 by -a (backward).
template <typename T>
__global__ void RopeKernel(T* qkv, const float* inv_freq, RopeDims d, float sign, float scale) {
  const int64_t n = d.rows * d.half;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = idx / d.half;
    const int i = static_cast<int>(idx % d.half);
    const int64_t position =
        d.positions != nullptr ? d.positions[row] : d.first_position + row % d.seq;
    const float angle = static_cast<float>(position) * inv_freq[i];
    const float c = cosf(angle) * scale, s = sign * sinf(angle) * scale;
    T* p = qkv + row * d.stride + i;
    for (int h = 0; h < d.heads; ++h, p += d.head_dim) {
      const float x0 = ToFloat(p[0]), x1 = ToFloat(p[d.half]);
      p[0] = FromFloat<T>(x0 * c - x1 * s);
      p[d.half] = FromFloat<T>(x1 * c + x0 * s);
    }
  }
}

RopeDims CheckRope(const Tensor& qkv, const AttentionHeads& heads, const Tensor& inv_freq,
                   const Tensor& positions, Device device, const char* op, const char* what) {
  CheckQkv(qkv, heads, device, op, what);
  ZTRAIN_CHECK(heads.head_dim % 2 == 0, op, ": head_dim = ", heads.head_dim,
               " must be even (RoPE turns pairs of features)");
  const int half = heads.head_dim / 2;
  CheckOnDevice(inv_freq, device, DType::kF32, {half}, op, "inv_freq");
  if (positions.defined()) {
    CheckOnDevice(positions, device, DType::kI32, {qkv.size(0), qkv.size(1)}, op, "positions");
  }
  return {qkv.size(0) * qkv.size(1), qkv.size(1), heads.qkv_width(),
          heads.num_heads + heads.num_kv_heads, half, heads.head_dim, 0,
          positions.defined() ? positions.data<const int32_t>() : nullptr};
}

void LaunchRope(const Tensor& qkv, const Tensor& inv_freq, const RopeDims& d, float sign,
                float scale, cudaStream_t stream) {
  if (d.rows == 0) return;
  DispatchFloat(qkv.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    RopeKernel<T><<<GridFor(d.rows * d.half), kThreads, 0, stream>>>(
        qkv.data<T>(), inv_freq.data<const float>(), d, sign, scale);
    ZTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void CudaOps::RopeForward(const Tensor& qkv, const AttentionHeads& heads, const Tensor& inv_freq,
                          int64_t first_position, float scale, const Tensor& positions) {
  RopeDims d = CheckRope(qkv, heads, inv_freq, positions, device(), "RopeForward", "qkv");
  ZTRAIN_CHECK(!positions.defined() || first_position == 0, "RopeForward: first_position = ",
               first_position, " with per-token positions; they give every row's position");
  d.first_position = first_position;
  LaunchRope(qkv, inv_freq, d, 1.0f, scale, stream_);
}

void CudaOps::RopeBackward(const Tensor& dqkv, const AttentionHeads& heads,
                           const Tensor& inv_freq, float scale, const Tensor& positions) {
  const RopeDims d =
      CheckRope(dqkv, heads, inv_freq, positions, device(), "RopeBackward", "dqkv");
  LaunchRope(dqkv, inv_freq, d, -1.0f, scale, stream_);
}

}  // namespace ztrain::kernels::cuda
