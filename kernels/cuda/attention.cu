// Causal self-attention with grouped key/value heads on the GPU, FlashAttention-2 style
// (ops.h contract: NH query heads, NKV key/value heads of HS features; query head h reads KV
// head h / (NH / NKV)). These kernels compute in fp32 on the CUDA cores, whatever the
// dtype; with CudaOpsOptions::tensor_core_attention bf16 and fp16 go to the tensor-core
// kernels of attention_tc.cu instead (Note [Tensor-core attention]).
//
// Note [CUDA attention tiles]: queries and keys are cut into tiles of 32 rows (one warp's
// width). A block of 4 warps owns one 32-row tile of one (batch, head); each warp owns 8 of
// its rows, and the 32 lanes of a warp take the 32 rows of the other tile, so a score tile
// is 8 x 32 dot products per warp with no cross-warp traffic. Tiles are staged in shared
// memory as fp32 (bf16 inputs are widened on load), zero-padded to kMaxHS columns (32, 64
// or 128: the head size rounded up) so the inner loops have compile-time bounds; rows read
// one per lane use a stride of kMaxHS + 4 floats so their float4 loads are bank-conflict
// free. Nothing of size T x T ever exists: scores and probabilities live in registers and a
// 32 x 32 shared tile.
//
// Backward is deterministic (no floating-point atomics): D_i = dO_i . O_i first, then one
// block per (batch, KV head, key tile) loops over the query heads that KV head serves, in
// order, and for each over the query tiles at or after the key tile, to produce dK and dV
// for its keys (the sum over the group stays in registers); and one block per (batch, query
// head, query tile) loops over the key tiles at or before it to produce dQ. Each dqkv element
// is written by exactly one thread, after a summation whose order depends on the shapes
// only. The scores are recomputed twice (once per pass), the usual price of avoiding atomics.
// With few KV heads the dK/dV pass is the narrow one: B * NKV * ceil(T / 32) blocks, each
// doing the work of NH / NKV query heads (multi-query attention at B = 1, T = 1024: 32 blocks).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/attention_shape.cuh"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"

namespace ztrain::kernels::cuda {
namespace {

constexpr int kTile = 32;  // rows per query or key tile (== warp size, Note above)
constexpr int kWarps = 4;
constexpr int kBlockThreads = kWarps * 32;
constexpr int kRows = kTile / kWarps;  // tile rows per warp
constexpr int kMaxHeadSize = 128;

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float Dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}
__device__ __forceinline__ float4 Load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

// dst[r * dst_stride + d] = rows [row0, row0 + kTile) of src (row r at src + r * src_stride)
// widened to fp32 for rows < seq and columns < hs; 0 elsewhere in kTile x kMaxHS.
template <int kMaxHS, typename T>
__device__ void LoadTile(float* dst, int dst_stride, const T* src, int64_t src_stride,
                         int64_t row0, int64_t seq, int hs) {
  for (int idx = threadIdx.x; idx < kTile * kMaxHS; idx += blockDim.x) {
    const int r = idx / kMaxHS, d = idx % kMaxHS;
    const int64_t t = row0 + r;
    dst[r * dst_stride + d] = (t < seq && d < hs) ? ToFloat(src[t * src_stride + d]) : 0.0f;
  }
}

struct TileIndex : AttentionTile {
  __device__ TileIndex(const AttentionShape& s, int heads, bool last_first)
      : AttentionTile(s, heads, kTile, last_first) {}
};

template <int kMaxHS>
constexpr size_t ForwardSmemFloats() {
  return kTile * kMaxHS + kTile * (kMaxHS + 4) + kTile * kMaxHS + kTile * kTile;
}

// One block per (batch, head, query tile); online softmax over the key tiles up to the
// diagonal one.
template <int kMaxHS, typename T>
__global__ void __launch_bounds__(kBlockThreads)
    AttentionForwardKernel(const T* qkv, T* out, float* lse, AttentionShape s, float scale) {
  constexpr int kD = kMaxHS / 32;  // head columns per lane
  constexpr int kPad = kMaxHS + 4;
  extern __shared__ float4 smem4[];
  float* sq = reinterpret_cast<float*>(smem4);  // [kTile][kMaxHS] queries (broadcast reads)
  float* sk = sq + kTile * kMaxHS;              // [kTile][kPad] keys (one row per lane)
  float* sv = sk + kTile * kPad;                // [kTile][kMaxHS] values
  float* sp = sv + kTile * kMaxHS;              // [kTile][kTile] probabilities

  const TileIndex ti(s, s.heads, /*last_first=*/true);
  const int64_t stride = s.qkv_width(), seq = s.seq;
  const T* rows = qkv + ti.b * seq * stride;
  const int64_t g = ti.h / s.group();
  const T* q = rows + s.QCol(ti.h);
  const T* k = rows + s.KCol(g);
  const T* v = rows + s.VCol(g);
  const int64_t i0 = ti.tile * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  LoadTile<kMaxHS>(sq, kMaxHS, q, stride, i0, seq, s.head_size);

  float acc[kRows][kD] = {};
  float row_max[kRows], row_sum[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.0f;
  }
  // Query and key tiles are aligned, so key tiles [0, i0] are all a query tile can see, and
  // every query row sees key j0 of each of them: row_max is finite after the first tile.
  for (int64_t j0 = 0; j0 <= i0; j0 += kTile) {
    __syncthreads();  // the previous tile's readers are done
    LoadTile<kMaxHS>(sk, kPad, k, stride, j0, seq, s.head_size);
    LoadTile<kMaxHS>(sv, kMaxHS, v, stride, j0, seq, s.head_size);
    __syncthreads();
    float score[kRows] = {};
#pragma unroll 4
    for (int d = 0; d < kMaxHS; d += 4) {
      const float4 kv = Load4(sk + lane * kPad + d);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        score[r] = Dot4(Load4(sq + (warp * kRows + r) * kMaxHS + d), kv, score[r]);
      }
    }
    const int64_t j = j0 + lane;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t i = i0 + warp * kRows + r;
      const float x = j <= i ? score[r] * scale : -INFINITY;  // causal mask
      const float new_max = fmaxf(row_max[r], WarpMax(x));
      const float p = expf(x - new_max);                 // 0 where masked
      const float alpha = expf(row_max[r] - new_max);    // 0 on the first tile
      row_sum[r] = row_sum[r] * alpha + WarpSum(p);
      row_max[r] = new_max;
#pragma unroll
      for (int c = 0; c < kD; ++c) acc[r][c] *= alpha;
      sp[(warp * kRows + r) * kTile + lane] = p;
    }
    __syncwarp();
    // acc[r][c] += sum_j p[r][j] * v[j][lane + 32 c]
#pragma unroll 2
    for (int jj = 0; jj < kTile; jj += 4) {
      float vv[4][kD];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
#pragma unroll
        for (int c = 0; c < kD; ++c) vv[u][c] = sv[(jj + u) * kMaxHS + lane + 32 * c];
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float4 p4 = Load4(sp + (warp * kRows + r) * kTile + jj);
#pragma unroll
        for (int c = 0; c < kD; ++c) {
          acc[r][c] = fmaf(p4.x, vv[0][c], acc[r][c]);
          acc[r][c] = fmaf(p4.y, vv[1][c], acc[r][c]);
          acc[r][c] = fmaf(p4.z, vv[2][c], acc[r][c]);
          acc[r][c] = fmaf(p4.w, vv[3][c], acc[r][c]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = i0 + warp * kRows + r;
    if (i >= seq) continue;
    const float inv = 1.0f / row_sum[r];
    T* o = out + (ti.b * seq + i) * s.out_width() + ti.h * s.head_size;
#pragma unroll
    for (int c = 0; c < kD; ++c) {
      const int d = lane + 32 * c;
      if (d < s.head_size) o[d] = FromFloat<T>(acc[r][c] * inv);
    }
    if (lane == 0) lse[ti.bh * seq + i] = row_max[r] + logf(row_sum[r]);
  }
}

// delta[b, h, t] = dout[b, t, head h] . out[b, t, head h]; one warp per (b, h, t).
template <typename T>
__global__ void AttentionDeltaKernel(const T* dout, const T* out, float* delta,
                                     AttentionShape s) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= s.batch * s.heads * s.seq) return;  // whole warps leave together
  const int64_t t = row % s.seq, bh = row / s.seq;
  const int64_t b = bh / s.heads, h = bh % s.heads;
  const int64_t off = (b * s.seq + t) * s.out_width() + h * s.head_size;
  float dot = 0.0f;
  for (int d = lane; d < s.head_size; d += 32) {
    dot = fmaf(ToFloat(dout[off + d]), ToFloat(out[off + d]), dot);
  }
  dot = WarpSum(dot);
  if (lane == 0) delta[row] = dot;
}

template <int kMaxHS>
constexpr size_t BackwardKvSmemFloats() {
  return 2 * kTile * kMaxHS + 2 * kTile * (kMaxHS + 4) + 2 * kTile * kTile + 2 * kTile;
}

// One block per (batch, KV head, key tile): dK and dV of its keys, summed over the query
// heads the KV head serves (in head order) and, for each, over the query tiles at or after
// the key tile. Lanes take queries, each warp 8 keys.
template <int kMaxHS, typename T>
__global__ void __launch_bounds__(kBlockThreads)
    AttentionBackwardKvKernel(const T* qkv, const T* dout, const float* lse,
                              const float* delta, T* dqkv, AttentionShape s, float scale) {
  constexpr int kD = kMaxHS / 32;
  constexpr int kPad = kMaxHS + 4;
  extern __shared__ float4 smem4[];
  float* sk = reinterpret_cast<float*>(smem4);  // [kTile][kMaxHS] keys (broadcast)
  float* sv = sk + kTile * kMaxHS;              // [kTile][kMaxHS] values (broadcast)
  float* sq = sv + kTile * kMaxHS;              // [kTile][kPad] queries (one per lane)
  float* sdo = sq + kTile * kPad;               // [kTile][kPad] dout rows (one per lane)
  float* sp = sdo + kTile * kPad;               // [key][query] probabilities
  float* sds = sp + kTile * kTile;              // [key][query] dS (scaled)
  float* slse = sds + kTile * kTile;            // [kTile]
  float* sdelta = slse + kTile;                 // [kTile]

  const TileIndex ti(s, s.kv_heads, /*last_first=*/false);  // early key tiles see the most
  const int64_t stride = s.qkv_width(), seq = s.seq;
  const int64_t rows_off = ti.b * seq * stride;
  const int64_t j0 = ti.tile * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  LoadTile<kMaxHS>(sk, kMaxHS, qkv + rows_off + s.KCol(ti.h), stride, j0, seq, s.head_size);
  LoadTile<kMaxHS>(sv, kMaxHS, qkv + rows_off + s.VCol(ti.h), stride, j0, seq, s.head_size);

  float dk[kRows][kD] = {}, dv[kRows][kD] = {};
  const int64_t h_end = (ti.h + 1) * s.group();
  for (int64_t h = ti.h * s.group(); h < h_end; ++h) {
    const T* q = qkv + rows_off + s.QCol(h);
    const T* dout_h = dout + ti.b * seq * s.out_width() + h * s.head_size;
    const int64_t bh = ti.b * s.heads + h;  // lse and delta row of query head h
    for (int64_t i0 = j0; i0 < seq; i0 += kTile) {
      __syncthreads();
      LoadTile<kMaxHS>(sq, kPad, q, stride, i0, seq, s.head_size);
      LoadTile<kMaxHS>(sdo, kPad, dout_h, s.out_width(), i0, seq, s.head_size);
      if (threadIdx.x < kTile) {
        const int64_t i = i0 + threadIdx.x;
        slse[threadIdx.x] = i < seq ? lse[bh * seq + i] : 0.0f;
        sdelta[threadIdx.x] = i < seq ? delta[bh * seq + i] : 0.0f;
      }
      __syncthreads();
      float score[kRows] = {}, dp[kRows] = {};
#pragma unroll 4
      for (int d = 0; d < kMaxHS; d += 4) {
        const float4 q4 = Load4(sq + lane * kPad + d);
        const float4 o4 = Load4(sdo + lane * kPad + d);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          score[r] = Dot4(q4, Load4(sk + (warp * kRows + r) * kMaxHS + d), score[r]);
          dp[r] = Dot4(o4, Load4(sv + (warp * kRows + r) * kMaxHS + d), dp[r]);
        }
      }
      const int64_t i = i0 + lane;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int64_t j = j0 + warp * kRows + r;
        const float p = (j <= i && i < seq) ? expf(score[r] * scale - slse[lane]) : 0.0f;
        sp[(warp * kRows + r) * kTile + lane] = p;
        sds[(warp * kRows + r) * kTile + lane] = p * (dp[r] - sdelta[lane]) * scale;
      }
      __syncwarp();
      // dv[r] += sum_i p[r][i] dO_i;  dk[r] += sum_i ds[r][i] Q_i
#pragma unroll 2
      for (int ii = 0; ii < kTile; ii += 4) {
        float qv[4][kD], ov[4][kD];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
#pragma unroll
          for (int c = 0; c < kD; ++c) {
            qv[u][c] = sq[(ii + u) * kPad + lane + 32 * c];
            ov[u][c] = sdo[(ii + u) * kPad + lane + 32 * c];
          }
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float4 p4 = Load4(sp + (warp * kRows + r) * kTile + ii);
          const float4 s4 = Load4(sds + (warp * kRows + r) * kTile + ii);
#pragma unroll
          for (int c = 0; c < kD; ++c) {
            dv[r][c] = fmaf(p4.x, ov[0][c], dv[r][c]);
            dv[r][c] = fmaf(p4.y, ov[1][c], dv[r][c]);
            dv[r][c] = fmaf(p4.z, ov[2][c], dv[r][c]);
            dv[r][c] = fmaf(p4.w, ov[3][c], dv[r][c]);
            dk[r][c] = fmaf(s4.x, qv[0][c], dk[r][c]);
            dk[r][c] = fmaf(s4.y, qv[1][c], dk[r][c]);
            dk[r][c] = fmaf(s4.z, qv[2][c], dk[r][c]);
            dk[r][c] = fmaf(s4.w, qv[3][c], dk[r][c]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t j = j0 + warp * kRows + r;
    if (j >= seq) continue;
    T* dk_row = dqkv + rows_off + j * stride + s.KCol(ti.h);
    T* dv_row = dqkv + rows_off + j * stride + s.VCol(ti.h);
#pragma unroll
    for (int c = 0; c < kD; ++c) {
      const int d = lane + 32 * c;
      if (d < s.head_size) {
        dk_row[d] = FromFloat<T>(dk[r][c]);
        dv_row[d] = FromFloat<T>(dv[r][c]);
      }
    }
  }
}

template <int kMaxHS>
constexpr size_t BackwardQSmemFloats() {
  return 2 * kTile * kMaxHS + 2 * kTile * (kMaxHS + 4) + kTile * kTile;
}

// One block per (batch, query head, query tile): dQ of its queries, summed over the key tiles
// of its KV head up to the diagonal. Lanes take keys, each warp 8 queries (as the forward).
template <int kMaxHS, typename T>
__global__ void __launch_bounds__(kBlockThreads)
    AttentionBackwardQKernel(const T* qkv, const T* dout, const float* lse,
                             const float* delta, T* dqkv, AttentionShape s, float scale) {
  constexpr int kD = kMaxHS / 32;
  constexpr int kPad = kMaxHS + 4;
  extern __shared__ float4 smem4[];
  float* sq = reinterpret_cast<float*>(smem4);  // [kTile][kMaxHS] queries (broadcast)
  float* sdo = sq + kTile * kMaxHS;             // [kTile][kMaxHS] dout rows (broadcast)
  float* sk = sdo + kTile * kMaxHS;             // [kTile][kPad] keys (one per lane)
  float* sv = sk + kTile * kPad;                // [kTile][kPad] values (one per lane)
  float* sds = sv + kTile * kPad;               // [query][key] dS (scaled)

  const TileIndex ti(s, s.heads, /*last_first=*/true);
  const int64_t stride = s.qkv_width(), seq = s.seq;
  const int64_t rows_off = ti.b * seq * stride;
  const int64_t g = ti.h / s.group();
  const T* q = qkv + rows_off + s.QCol(ti.h);
  const T* k = qkv + rows_off + s.KCol(g);
  const T* v = qkv + rows_off + s.VCol(g);
  const int64_t out_off = ti.b * seq * s.out_width() + ti.h * s.head_size;
  const int64_t i0 = ti.tile * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  LoadTile<kMaxHS>(sq, kMaxHS, q, stride, i0, seq, s.head_size);
  LoadTile<kMaxHS>(sdo, kMaxHS, dout + out_off, s.out_width(), i0, seq, s.head_size);
  float row_lse[kRows], row_delta[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = i0 + warp * kRows + r;
    row_lse[r] = i < seq ? lse[ti.bh * seq + i] : 0.0f;
    row_delta[r] = i < seq ? delta[ti.bh * seq + i] : 0.0f;
  }

  float dq[kRows][kD] = {};
  for (int64_t j0 = 0; j0 <= i0; j0 += kTile) {
    __syncthreads();
    LoadTile<kMaxHS>(sk, kPad, k, stride, j0, seq, s.head_size);
    LoadTile<kMaxHS>(sv, kPad, v, stride, j0, seq, s.head_size);
    __syncthreads();
    float score[kRows] = {}, dp[kRows] = {};
#pragma unroll 4
    for (int d = 0; d < kMaxHS; d += 4) {
      const float4 k4 = Load4(sk + lane * kPad + d);
      const float4 v4 = Load4(sv + lane * kPad + d);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        score[r] = Dot4(Load4(sq + (warp * kRows + r) * kMaxHS + d), k4, score[r]);
        dp[r] = Dot4(Load4(sdo + (warp * kRows + r) * kMaxHS + d), v4, dp[r]);
      }
    }
    const int64_t j = j0 + lane;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t i = i0 + warp * kRows + r;
      const float p = (j <= i && i < seq) ? expf(score[r] * scale - row_lse[r]) : 0.0f;
      sds[(warp * kRows + r) * kTile + lane] = p * (dp[r] - row_delta[r]) * scale;
    }
    __syncwarp();
    // dq[r] += sum_j ds[r][j] K_j
#pragma unroll 2
    for (int jj = 0; jj < kTile; jj += 4) {
      float kv[4][kD];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
#pragma unroll
        for (int c = 0; c < kD; ++c) kv[u][c] = sk[(jj + u) * kPad + lane + 32 * c];
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float4 s4 = Load4(sds + (warp * kRows + r) * kTile + jj);
#pragma unroll
        for (int c = 0; c < kD; ++c) {
          dq[r][c] = fmaf(s4.x, kv[0][c], dq[r][c]);
          dq[r][c] = fmaf(s4.y, kv[1][c], dq[r][c]);
          dq[r][c] = fmaf(s4.z, kv[2][c], dq[r][c]);
          dq[r][c] = fmaf(s4.w, kv[3][c], dq[r][c]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = i0 + warp * kRows + r;
    if (i >= seq) continue;
    T* dq_row = dqkv + rows_off + i * stride + s.QCol(ti.h);
#pragma unroll
    for (int c = 0; c < kD; ++c) {
      const int d = lane + 32 * c;
      if (d < s.head_size) dq_row[d] = FromFloat<T>(dq[r][c]);
    }
  }
}

// Launches `kernel` with `smem_floats` of dynamic shared memory, opting in above the 48 KiB
// default (kMaxHS = 128 needs ~53 KiB forward, ~73 KiB for dK/dV).
template <typename Kernel, typename... Args>
void Launch(Kernel kernel, int64_t blocks, size_t smem_floats, cudaStream_t stream,
            Args... args) {
  const size_t bytes = smem_floats * sizeof(float);
  if (bytes > 48 * 1024) {
    ZTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
  }
  kernel<<<static_cast<unsigned>(blocks), kBlockThreads, bytes, stream>>>(args...);
  ZTRAIN_CUDA_CHECK_LAUNCH();
}

template <int kMaxHS, typename T>
void LaunchForward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                   const AttentionShape& s, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_size));
  Launch(AttentionForwardKernel<kMaxHS, T>, s.batch * s.heads * s.TilesOf(kTile),
         ForwardSmemFloats<kMaxHS>(), stream, qkv.data<const T>(), out.data<T>(),
         lse.data<float>(), s, scale);
}

template <int kMaxHS, typename T>
void LaunchBackward(const Tensor& dout, const Tensor& qkv, const float* lse, const float* delta,
                    const Tensor& dqkv, const AttentionShape& s, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_size));
  Launch(AttentionBackwardKvKernel<kMaxHS, T>, s.batch * s.kv_heads * s.TilesOf(kTile),
         BackwardKvSmemFloats<kMaxHS>(), stream, qkv.data<const T>(), dout.data<const T>(), lse,
         delta, dqkv.data<T>(), s, scale);
  Launch(AttentionBackwardQKernel<kMaxHS, T>, s.batch * s.heads * s.TilesOf(kTile),
         BackwardQSmemFloats<kMaxHS>(), stream,
         qkv.data<const T>(), dout.data<const T>(), lse, delta, dqkv.data<T>(), s, scale);
}

// Calls fn.template operator()<kMaxHS, T>() for the tensor type and the head size rounded
// up to 32, 64 or 128.
template <typename Fn>
void DispatchAttention(DType dtype, int head_size, Fn&& fn) {
  DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (head_size <= 32) {
      fn.template operator()<32, T>();
    } else if (head_size <= 64) {
      fn.template operator()<64, T>();
    } else {
      fn.template operator()<128, T>();
    }
  });
}

// Calls fn(TypeTag<T>{}) for bf16 or fp16 when the tensor-core kernels are chosen
// (CudaOpsOptions::tensor_core_attention, Note [Tensor-core attention]); false otherwise.
template <typename Fn>
bool DispatchTensorCores(bool chosen, DType dtype, Fn&& fn) {
  if (!chosen || dtype == DType::kF32) return false;
  DispatchFloat(dtype, [&](auto tag) {
    if constexpr (!std::is_same_v<typename decltype(tag)::type, float>) fn(tag);
  });
  return true;
}

// Checks heads and qkv [B,T,(NH+2*NKV)*HS] (fp32, bf16 or fp16; CheckQkv), HS <= 128, out
// [B,T,NH*HS] of qkv's dtype and lse [B,NH,T] fp32.
AttentionShape CheckAttention(const Tensor& qkv, const AttentionHeads& heads, const Tensor& out,
                              const Tensor& lse, Device device, const char* op) {
  CheckQkv(qkv, heads, device, op, "qkv");
  ZTRAIN_CHECK(heads.head_dim <= kMaxHeadSize, op, ": head_dim = ", heads.head_dim,
               " is above the CUDA attention kernels' limit of ", kMaxHeadSize);
  const AttentionShape s{qkv.size(0), qkv.size(1), heads.num_heads, heads.num_kv_heads,
                         heads.head_dim};
  CheckOnDevice(out, device, qkv.dtype(), {s.batch, s.seq, s.out_width()}, op, "out");
  CheckOnDevice(lse, device, DType::kF32, {s.batch, s.heads, s.seq}, op, "lse");
  CheckInt32(s.batch * s.heads * s.TilesOf(kTile), op, "B * NH * ceil(T / 32) (thread blocks)");
  CheckInt32(s.batch * s.heads * s.seq * 32, op, "B * NH * T * 32 (threads of the D pass)");
  return s;
}

// Sliding windows and packed documents (AttentionMask) run on the CPU kernels only so far.
void CheckCausalOnly(const AttentionMask& mask, const Device& device, const char* op) {
  ZTRAIN_CHECK(mask.causal_only(), op, ": sliding-window attention and packed documents are not "
               "yet on ", device.ToString(), "'s kernels (the CPU has them); drop the model's "
               "sliding_window or data.packed_documents, or train on the CPU");
}

}  // namespace

void CudaOps::AttentionForward(const Tensor& qkv, const AttentionHeads& heads,
                               const AttentionMask& mask, const Tensor& out, const Tensor& lse) {
  constexpr const char* kOp = "AttentionForward";
  CheckCausalOnly(mask, device(), kOp);
  if (NeedsWidening({qkv, out})) {  // Note [Mixed dtypes on CUDA]; lse stays fp32
    Widened w(*this);
    AttentionForward(w.In(qkv), heads, w.Out(out), lse);
    w.Commit();
    return;
  }
  const AttentionShape s = CheckAttention(qkv, heads, out, lse, device(), kOp);
  if (s.batch * s.seq == 0) return;
  const bool tc = DispatchTensorCores(options_.tensor_core_attention, qkv.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    TcAttentionForward(qkv.data<const T>(), out.data<T>(), lse.data<float>(), s, stream_);
  });
  if (tc) return;
  DispatchAttention(qkv.dtype(), s.head_size, [&]<int kMaxHS, typename T>() {
    LaunchForward<kMaxHS, T>(qkv, out, lse, s, stream_);
  });
}

void CudaOps::AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                const Tensor& lse, const AttentionHeads& heads,
                                const AttentionMask& mask, const Tensor& dqkv) {
  constexpr const char* kOp = "AttentionBackward";
  CheckCausalOnly(mask, device(), kOp);
  if (NeedsWidening({dout, qkv, out, dqkv})) {
    Widened w(*this);
    AttentionBackward(w.In(dout), w.In(qkv), w.In(out), lse, heads, w.Out(dqkv));
    w.Commit();
    return;
  }
  const AttentionShape s = CheckAttention(qkv, heads, out, lse, device(), kOp);
  CheckLike(dout, out, kOp, "dout");
  CheckLike(dqkv, qkv, kOp, "dqkv");
  if (s.batch * s.seq == 0) return;
  const int64_t rows = s.batch * s.heads * s.seq;
  auto* delta = static_cast<float*>(Workspace(rows * sizeof(float)));
  constexpr int kDeltaThreads = 256;
  const int64_t delta_blocks = (rows * 32 + kDeltaThreads - 1) / kDeltaThreads;
  DispatchFloat(qkv.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    AttentionDeltaKernel<<<static_cast<unsigned>(delta_blocks), kDeltaThreads, 0, stream_>>>(
        dout.data<const T>(), out.data<const T>(), delta, s);
    ZTRAIN_CUDA_CHECK_LAUNCH();
  });
  const bool tc = DispatchTensorCores(options_.tensor_core_attention, qkv.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    TcAttentionBackward(qkv.data<const T>(), dout.data<const T>(), lse.data<const float>(),
                        delta, dqkv.data<T>(), s, stream_);
  });
  if (tc) return;
  DispatchAttention(qkv.dtype(), s.head_size, [&]<int kMaxHS, typename T>() {
    LaunchBackward<kMaxHS, T>(dout, qkv, lse.data<const float>(), delta, dqkv, s, stream_);
  });
}

}  // namespace ztrain::kernels::cuda
