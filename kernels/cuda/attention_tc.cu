// Note [Tensor-core attention]: bf16 and fp16 causal attention whose five products (S = Q K^T,
// O += P V; and in backward dP = dO V^T, dV += P^T dO, dK += dS^T Q, dQ += dS K) run on
// tensor cores (WMMA 16 x 16 x 16 fragments, 16-bit inputs, fp32 accumulation), on
// FlashAttention-2's plan: nothing of size T x T, the forward's online softmax keeps the
// log-sum-exp, the backward recomputes P from it. On an H200 the fp32-arithmetic kernels of
// attention.cu reached ~11 TFLOP/s and took three quarters of a GPT-2 bf16 step (docs/gpu.md).
// Status: written and compiled after that run, when no GPU was left to run them on, so
// CudaOps uses them only when CudaOpsOptions::tensor_core_attention asks; the cross-backend
// test (TensorCoreAttentionMatchesCpu) checks them against the CPU wherever a GPU is.
//
// - Tiles: a block of 4 warps owns 64 query rows (forward, dQ) or 64 keys (dK/dV), 16 per
//   warp, and walks the other side in tiles of 64; tiles are staged in shared memory in the
//   input dtype, head columns zero-padded to kHS (32, 64 or 128), rows past T zero.
// - Scores leave the fragments through a per-warp fp32 shared tile, where two lanes per row
//   apply the causal mask, the softmax and (backward) dS = P (dP - D) / sqrt(HS), and write
//   P or dS back in the input dtype as the next product's A operand: P and dS are rounded to
//   the 16-bit dtype before their products, as in FlashAttention; the row sums and the
//   log-sum-exp stay fp32. The forward's O accumulator lives in the same per-warp shared
//   space (fp32), so each row can be rescaled when its running maximum grows.
// - Fragments wholly above the causal diagonal are skipped.
// - Deterministic, as the fp32 kernels (Note [CUDA attention tiles]): dK and dV by one block
//   per (batch, KV head, key tile) over the group's query heads in order, dQ by one block
//   per (batch, query head, query tile); every output element is written once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernel_utils.cuh"

namespace ztrain::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTc = 64;      // rows of a query or key tile
constexpr int kTcWarps = 4;  // 16 rows each
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kFr = 16;  // WMMA fragment edge

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, kFr, kFr, kFr, T, wmma::row_major>;
template <typename T>
using FragBCol = wmma::fragment<wmma::matrix_b, kFr, kFr, kFr, T, wmma::col_major>;
template <typename T>
using FragBRow = wmma::fragment<wmma::matrix_b, kFr, kFr, kFr, T, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, kFr, kFr, kFr, float>;

// Shared-memory strides (elements): 16-bit tiles, fp32 scratch, 16-bit P / dS.
template <int kHS>
struct Strides {
  static constexpr int kHalf = kHS + 8;                         // [row][kHS] 16-bit
  static constexpr int kScratch = (kHS > kTc ? kHS : kTc) + 4;  // [16][max] fp32
  static constexpr int kProb = kTc + 8;                         // [16][kTc] 16-bit
  static constexpr size_t TileBytes() { return size_t{kTc} * kHalf * 2; }
  static constexpr size_t ScratchBytes() { return size_t{kTcWarps} * kFr * kScratch * 4; }
  static constexpr size_t ProbBytes() { return size_t{kTcWarps} * kFr * kProb * 2; }
};

// dst[r][d] = src row row0 + r, column d (rows < seq, columns < hs), else 0; 16-byte chunks
// when `vec` (hs, the row stride and the base are multiples of 8 elements).
template <int kHS, typename T>
__device__ void LoadTcTile(T* dst, const T* src, int64_t stride, int64_t row0, int64_t seq, int hs,
                           bool vec) {
  constexpr int ld = Strides<kHS>::kHalf;
  if (vec) {
    constexpr int kChunks = kHS / 8;
    for (int idx = threadIdx.x; idx < kTc * kChunks; idx += blockDim.x) {
      const int r = idx / kChunks, d = (idx % kChunks) * 8;
      const int64_t t = row0 + r;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (t < seq && d < hs) v = *reinterpret_cast<const uint4*>(src + t * stride + d);
      *reinterpret_cast<uint4*>(dst + r * ld + d) = v;
    }
    return;
  }
  for (int idx = threadIdx.x; idx < kTc * kHS; idx += blockDim.x) {
    const int r = idx / kHS, d = idx % kHS;
    const int64_t t = row0 + r;
    dst[r * ld + d] = (t < seq && d < hs) ? src[t * stride + d] : FromFloat<T>(0.0f);
  }
}

// c += a (16 x kK, row-major at `a`, stride lda) times the transpose of the 16 rows of kK
// columns at b (stride ldb): WMMA's col-major B.
template <int kK, typename T>
__device__ __forceinline__ void ProductWithTranspose(FragC& c, const T* a, int lda, const T* b,
                                                     int ldb) {
#pragma unroll
  for (int k = 0; k < kK; k += kFr) {
    FragA<T> fa;
    FragBCol<T> fb;
    wmma::load_matrix_sync(fa, a + k, lda);
    wmma::load_matrix_sync(fb, b + k, ldb);
    wmma::mma_sync(c, fa, fb, c);
  }
}

// S[16][kTc] (fp32 scratch, stride kScratch) = A (16 x kHS rows at a) times the transpose of
// the kTc rows at b; fragments n with columns all above the causal limit (col0 + 16 n >
// last_visible) are left unwritten.
template <int kHS, typename T>
__device__ void ScoresTimesTranspose(float* s, const T* a, const T* b, int64_t col0,
                                     int64_t last_visible) {
  constexpr int ldh = Strides<kHS>::kHalf, lds = Strides<kHS>::kScratch;
#pragma unroll
  for (int n = 0; n < kTc / kFr; ++n) {
    if (col0 + n * kFr > last_visible) continue;
    FragC c;
    wmma::fill_fragment(c, 0.0f);
    ProductWithTranspose<kHS>(c, a, ldh, b + n * kFr * ldh, ldh);
    wmma::store_matrix_sync(s + n * kFr, c, lds, wmma::mem_row_major);
  }
}

// Key fragments of a tile at or below the causal limit, `reach` = last visible key - tile start.
__device__ __forceinline__ int KeyFragments(int64_t reach) {
  const int64_t frags = reach / kFr + 1;
  return frags < kTc / kFr ? static_cast<int>(frags) : kTc / kFr;
}

struct TcTile : AttentionTile {
  __device__ TcTile(const AttentionShape& s, int heads, bool last_first)
      : AttentionTile(s, heads, kTc, last_first) {}
};

template <int kHS>
constexpr size_t TcForwardSmem() {
  using St = Strides<kHS>;
  return 3 * St::TileBytes() + 2 * St::ScratchBytes() + St::ProbBytes();
}

template <int kHS, typename T>
__global__ void __launch_bounds__(kTcThreads)
    TcForwardKernel(const T* qkv, T* out, float* lse, AttentionShape s, float scale, bool vec) {
  using St = Strides<kHS>;
  constexpr int ldh = St::kHalf, lds = St::kScratch, ldp = St::kProb;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem);
  T* sk = sq + kTc * ldh;
  T* sv = sk + kTc * ldh;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* ws = reinterpret_cast<float*>(sv + kTc * ldh) + warp * kFr * lds;               // scores
  float* wo = reinterpret_cast<float*>(sv + kTc * ldh) + (kTcWarps + warp) * kFr * lds;  // O (fp32)
  T* wp =
      reinterpret_cast<T*>(reinterpret_cast<float*>(sv + kTc * ldh) + 2 * kTcWarps * kFr * lds) +
      warp * kFr * ldp;  // P

  const TcTile ti(s, s.heads, /*last_first=*/true);
  const int64_t stride = s.qkv_width(), seq = s.seq;
  const T* rows = qkv + ti.b * seq * stride;
  const int64_t g = ti.h / s.group();
  const int64_t i0 = ti.tile * kTc, w0 = i0 + warp * kFr;  // the warp's first query
  LoadTcTile<kHS>(sq, rows + s.QCol(ti.h), stride, i0, seq, s.head_size, vec);
  for (int idx = lane; idx < kFr * kHS; idx += 32) wo[(idx / kHS) * lds + idx % kHS] = 0.0f;
  // Two lanes per row: row r of the warp's 16, columns [half * 32, half * 32 + 32) of a
  // score tile and [half * kHS / 2, (half + 1) * kHS / 2) of O.
  const int r = lane / 2, half = lane % 2;
  const int64_t i = w0 + r;
  float row_max = -INFINITY, row_sum = 0.0f;
  for (int64_t j0 = 0; j0 <= i0; j0 += kTc) {
    __syncthreads();
    LoadTcTile<kHS>(sk, rows + s.KCol(g), stride, j0, seq, s.head_size, vec);
    LoadTcTile<kHS>(sv, rows + s.VCol(g), stride, j0, seq, s.head_size, vec);
    __syncthreads();
    const int64_t last = w0 + kFr - 1;  // the warp's last query sees keys up to itself
    ScoresTimesTranspose<kHS>(ws, sq + warp * kFr * ldh, sk, j0, last);
    __syncwarp();
    float x[32];
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int col = half * 32 + c;
      x[c] = j0 + col <= i ? ws[r * lds + col] * scale : -INFINITY;
      tile_max = fmaxf(tile_max, x[c]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    // Key j0 <= i0 <= i is visible to every row, so the maximum is finite from the first tile.
    const float new_max = fmaxf(row_max, tile_max);
    const float alpha = expf(row_max - new_max);  // 0 on the first tile
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const float p = expf(x[c] - new_max);
      sum += p;
      wp[r * ldp + half * 32 + c] = FromFloat<T>(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    row_sum = row_sum * alpha + sum;
    row_max = new_max;
#pragma unroll
    for (int c = 0; c < kHS / 2; ++c) wo[r * lds + half * (kHS / 2) + c] *= alpha;
    __syncwarp();
    // O += P V over the key fragments at or below the diagonal.
    const int key_frags = KeyFragments(last - j0);
#pragma unroll
    for (int n = 0; n < kHS / kFr; ++n) {
      FragC o;
      wmma::load_matrix_sync(o, wo + n * kFr, lds, wmma::mem_row_major);
      for (int k = 0; k < key_frags; ++k) {
        FragA<T> fa;
        FragBRow<T> fb;
        wmma::load_matrix_sync(fa, wp + k * kFr, ldp);
        wmma::load_matrix_sync(fb, sv + k * kFr * ldh + n * kFr, ldh);
        wmma::mma_sync(o, fa, fb, o);
      }
      wmma::store_matrix_sync(wo + n * kFr, o, lds, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (i < seq) {
    const float inv = 1.0f / row_sum;
    T* o = out + (ti.b * seq + i) * s.out_width() + ti.h * s.head_size;
    for (int c = 0; c < kHS / 2; ++c) {
      const int d = half * (kHS / 2) + c;
      if (d < s.head_size) o[d] = FromFloat<T>(wo[r * lds + d] * inv);
    }
    if (half == 0) lse[ti.bh * seq + i] = row_max + logf(row_sum);
  }
}

// The warp's 16 x kHS accumulators, through its fp32 scratch, into `dst` rows (row r at
// dst + (row0 + r) * stride) for rows < seq and columns < hs, in T.
template <int kHS, typename T>
__device__ void StoreRows(FragC (&acc)[kHS / kFr], float* scratch, T* dst, int64_t stride,
                          int64_t row0, int64_t seq, int hs) {
  constexpr int lds = Strides<kHS>::kScratch;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < kHS / kFr; ++n) {
    wmma::store_matrix_sync(scratch + n * kFr, acc[n], lds, wmma::mem_row_major);
  }
  __syncwarp();
  for (int idx = lane; idx < kFr * kHS; idx += 32) {
    const int r = idx / kHS, d = idx % kHS;
    if (row0 + r < seq && d < hs) dst[(row0 + r) * stride + d] = FromFloat<T>(scratch[r * lds + d]);
  }
  __syncwarp();
}

template <int kHS>
constexpr size_t TcBackwardSmem() {
  using St = Strides<kHS>;
  return 4 * St::TileBytes() + 2 * St::ScratchBytes() + 2 * St::ProbBytes() + 2 * kTc * 4;
}

// Pointers into the backward's shared memory (the same layout for both passes).
template <int kHS, typename T>
struct BackwardSmem {
  T *rows_a, *rows_b, *other_a, *other_b;  // four 16-bit tiles
  float *s, *dp;                           // this warp's fp32 scratch
  T *p, *ds;                               // this warp's 16-bit P and dS
  float *lse, *delta;                      // [kTc] each
  __device__ BackwardSmem(unsigned char* smem, int warp) {
    using St = Strides<kHS>;
    rows_a = reinterpret_cast<T*>(smem);
    rows_b = rows_a + kTc * St::kHalf;
    other_a = rows_b + kTc * St::kHalf;
    other_b = other_a + kTc * St::kHalf;
    auto* scratch = reinterpret_cast<float*>(other_b + kTc * St::kHalf);
    s = scratch + warp * kFr * St::kScratch;
    dp = scratch + (kTcWarps + warp) * kFr * St::kScratch;
    auto* probs = reinterpret_cast<T*>(scratch + 2 * kTcWarps * kFr * St::kScratch);
    p = probs + warp * kFr * St::kProb;
    ds = probs + (kTcWarps + warp) * kFr * St::kProb;
    lse = reinterpret_cast<float*>(probs + 2 * kTcWarps * kFr * St::kProb);
    delta = lse + kTc;
  }
};

// One block per (batch, query head, query tile of 64): dQ = sum over key tiles at or before
// it of dS K. rows_a/rows_b hold Q and dO, other_a/other_b K and V.
template <int kHS, typename T>
__global__ void __launch_bounds__(kTcThreads)
    TcBackwardQKernel(const T* qkv, const T* dout, const float* lse, const float* delta, T* dqkv,
                      AttentionShape s, float scale, bool vec) {
  constexpr int ldh = Strides<kHS>::kHalf, lds = Strides<kHS>::kScratch;
  constexpr int ldp = Strides<kHS>::kProb;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const BackwardSmem<kHS, T> sm(smem, warp);
  const TcTile ti(s, s.heads, /*last_first=*/true);
  const int64_t stride = s.qkv_width(), seq = s.seq;
  const T* rows = qkv + ti.b * seq * stride;
  const int64_t g = ti.h / s.group();
  const int64_t i0 = ti.tile * kTc, w0 = i0 + warp * kFr;
  LoadTcTile<kHS>(sm.rows_a, rows + s.QCol(ti.h), stride, i0, seq, s.head_size, vec);
  LoadTcTile<kHS>(sm.rows_b, dout + ti.b * seq * s.out_width() + ti.h * s.head_size, s.out_width(),
                  i0, seq, s.head_size, vec);
  const int r = lane / 2, half = lane % 2;
  const int64_t i = w0 + r;
  const float row_lse = i < seq ? lse[ti.bh * seq + i] : 0.0f;
  const float row_delta = i < seq ? delta[ti.bh * seq + i] : 0.0f;
  FragC dq[kHS / kFr];
#pragma unroll
  for (int n = 0; n < kHS / kFr; ++n) wmma::fill_fragment(dq[n], 0.0f);
  const int64_t last = w0 + kFr - 1;
  for (int64_t j0 = 0; j0 <= i0; j0 += kTc) {
    __syncthreads();
    LoadTcTile<kHS>(sm.other_a, rows + s.KCol(g), stride, j0, seq, s.head_size, vec);
    LoadTcTile<kHS>(sm.other_b, rows + s.VCol(g), stride, j0, seq, s.head_size, vec);
    __syncthreads();
    ScoresTimesTranspose<kHS>(sm.s, sm.rows_a + warp * kFr * ldh, sm.other_a, j0, last);
    ScoresTimesTranspose<kHS>(sm.dp, sm.rows_b + warp * kFr * ldh, sm.other_b, j0, last);
    __syncwarp();
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const int col = half * 32 + c;
      const int64_t j = j0 + col;
      // Masked scores were not computed: their scratch is not read.
      const bool visible = j <= i && i < seq;
      const float p = visible ? expf(sm.s[r * lds + col] * scale - row_lse) : 0.0f;
      const float ds = visible ? p * (sm.dp[r * lds + col] - row_delta) * scale : 0.0f;
      sm.ds[r * ldp + col] = FromFloat<T>(ds);
    }
    __syncwarp();
    const int key_frags = KeyFragments(last - j0);
#pragma unroll
    for (int n = 0; n < kHS / kFr; ++n) {
      for (int k = 0; k < key_frags; ++k) {
        FragA<T> fa;
        FragBRow<T> fb;
        wmma::load_matrix_sync(fa, sm.ds + k * kFr, ldp);
        wmma::load_matrix_sync(fb, sm.other_a + k * kFr * ldh + n * kFr, ldh);
        wmma::mma_sync(dq[n], fa, fb, dq[n]);
      }
    }
  }
  StoreRows<kHS>(dq, sm.s, dqkv + ti.b * seq * stride + s.QCol(ti.h), stride, w0, seq, s.head_size);
}

// One block per (batch, KV head, key tile of 64): dK and dV of its keys, over the query heads
// the KV head serves (in order) and their query tiles at or after the key tile. other_a /
// other_b hold K and V, rows_a / rows_b each query tile's Q and dO; per warp 16 keys.
template <int kHS, typename T>
__global__ void __launch_bounds__(kTcThreads)
    TcBackwardKvKernel(const T* qkv, const T* dout, const float* lse, const float* delta, T* dqkv,
                       AttentionShape s, float scale, bool vec) {
  constexpr int ldh = Strides<kHS>::kHalf, lds = Strides<kHS>::kScratch;
  constexpr int ldp = Strides<kHS>::kProb;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const BackwardSmem<kHS, T> sm(smem, warp);
  const TcTile ti(s, s.kv_heads, /*last_first=*/false);  // early key tiles see the most
  const int64_t stride = s.qkv_width(), seq = s.seq;
  const T* rows = qkv + ti.b * seq * stride;
  const int64_t j0 = ti.tile * kTc, w0 = j0 + warp * kFr;  // the warp's first key
  LoadTcTile<kHS>(sm.other_a, rows + s.KCol(ti.h), stride, j0, seq, s.head_size, vec);
  LoadTcTile<kHS>(sm.other_b, rows + s.VCol(ti.h), stride, j0, seq, s.head_size, vec);
  const int r = lane / 2, half = lane % 2;
  const int64_t j = w0 + r;  // this lane pair's key
  FragC dk[kHS / kFr], dv[kHS / kFr];
#pragma unroll
  for (int n = 0; n < kHS / kFr; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  const int64_t h_end = (ti.h + 1) * s.group();
  for (int64_t h = ti.h * s.group(); h < h_end; ++h) {
    const T* dout_h = dout + ti.b * seq * s.out_width() + h * s.head_size;
    const int64_t bh = ti.b * s.heads + h;
    for (int64_t i0 = j0; i0 < seq; i0 += kTc) {
      __syncthreads();
      LoadTcTile<kHS>(sm.rows_a, rows + s.QCol(h), stride, i0, seq, s.head_size, vec);
      LoadTcTile<kHS>(sm.rows_b, dout_h, s.out_width(), i0, seq, s.head_size, vec);
      if (threadIdx.x < kTc) {
        const int64_t q = i0 + threadIdx.x;
        sm.lse[threadIdx.x] = q < seq ? lse[bh * seq + q] : 0.0f;
        sm.delta[threadIdx.x] = q < seq ? delta[bh * seq + q] : 0.0f;
      }
      __syncthreads();
      // Query fragments wholly before the warp's first key see none of its keys.
      const int first_frag = static_cast<int>(std::max<int64_t>(0, (w0 - i0) / kFr));
      // S^T = K Q^T and dP^T = V dO^T for this warp's keys (all 4 fragments; the masked
      // ones are cheap beside the loads and keep the loop simple).
      ScoresTimesTranspose<kHS>(sm.s, sm.other_a + warp * kFr * ldh, sm.rows_a, 0, kTc);
      ScoresTimesTranspose<kHS>(sm.dp, sm.other_b + warp * kFr * ldh, sm.rows_b, 0, kTc);
      __syncwarp();
#pragma unroll 8
      for (int c = 0; c < 32; ++c) {
        const int col = half * 32 + c;
        const int64_t q = i0 + col;
        const bool visible = j <= q && q < seq;
        const float p = visible ? expf(sm.s[r * lds + col] * scale - sm.lse[col]) : 0.0f;
        const float ds = visible ? p * (sm.dp[r * lds + col] - sm.delta[col]) * scale : 0.0f;
        sm.p[r * ldp + col] = FromFloat<T>(p);
        sm.ds[r * ldp + col] = FromFloat<T>(ds);
      }
      __syncwarp();
#pragma unroll
      for (int n = 0; n < kHS / kFr; ++n) {
        for (int k = first_frag; k < kTc / kFr; ++k) {
          FragA<T> fp, fds;
          FragBRow<T> fdo, fq;
          wmma::load_matrix_sync(fp, sm.p + k * kFr, ldp);
          wmma::load_matrix_sync(fds, sm.ds + k * kFr, ldp);
          wmma::load_matrix_sync(fdo, sm.rows_b + k * kFr * ldh + n * kFr, ldh);
          wmma::load_matrix_sync(fq, sm.rows_a + k * kFr * ldh + n * kFr, ldh);
          wmma::mma_sync(dv[n], fp, fdo, dv[n]);
          wmma::mma_sync(dk[n], fds, fq, dk[n]);
        }
      }
    }
  }
  T* base = dqkv + ti.b * seq * stride;
  StoreRows<kHS>(dk, sm.s, base + s.KCol(ti.h), stride, w0, seq, s.head_size);
  StoreRows<kHS>(dv, sm.s, base + s.VCol(ti.h), stride, w0, seq, s.head_size);
}

template <typename Kernel, typename... Args>
void LaunchTc(Kernel kernel, int64_t blocks, size_t smem, cudaStream_t stream, Args... args) {
  if (smem > 48 * 1024) {
    ZTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  }
  kernel<<<static_cast<unsigned>(blocks), kTcThreads, smem, stream>>>(args...);
  ZTRAIN_CUDA_CHECK_LAUNCH();
}

// Whether 16-byte loads may be used: head columns, row strides and bases in whole chunks.
template <typename T>
bool Vectorizable(const AttentionShape& s, const T* a, const T* b) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return s.head_size % 8 == 0 && s.qkv_width() % 8 == 0 && s.out_width() % 8 == 0 && aligned(a) &&
         aligned(b);
}

// fn.template operator()<kHS>() for the head size rounded up to 32, 64 or 128.
template <typename Fn>
void DispatchHeadSize(int head_size, Fn&& fn) {
  if (head_size <= 32) {
    fn.template operator()<32>();
  } else if (head_size <= 64) {
    fn.template operator()<64>();
  } else {
    fn.template operator()<128>();
  }
}

}  // namespace

template <typename T>
void TcAttentionForward(const T* qkv, T* out, float* lse, const AttentionShape& s,
                        cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_size));
  const bool vec = Vectorizable(s, qkv, qkv);
  DispatchHeadSize(s.head_size, [&]<int kHS>() {
    LaunchTc(TcForwardKernel<kHS, T>, s.batch * s.heads * s.TilesOf(kTc), TcForwardSmem<kHS>(),
             stream, qkv, out, lse, s, scale, vec);
  });
}

template <typename T>
void TcAttentionBackward(const T* qkv, const T* dout, const float* lse, const float* delta, T* dqkv,
                         const AttentionShape& s, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_size));
  const bool vec = Vectorizable(s, qkv, dout);
  DispatchHeadSize(s.head_size, [&]<int kHS>() {
    LaunchTc(TcBackwardKvKernel<kHS, T>, s.batch * s.kv_heads * s.TilesOf(kTc),
             TcBackwardSmem<kHS>(), stream, qkv, dout, lse, delta, dqkv, s, scale, vec);
    LaunchTc(TcBackwardQKernel<kHS, T>, s.batch * s.heads * s.TilesOf(kTc), TcBackwardSmem<kHS>(),
             stream, qkv, dout, lse, delta, dqkv, s, scale, vec);
  });
}

template void TcAttentionForward(const __nv_bfloat16*, __nv_bfloat16*, float*,
                                 const AttentionShape&, cudaStream_t);
template void TcAttentionForward(const __half*, __half*, float*, const AttentionShape&,
                                 cudaStream_t);
template void TcAttentionBackward(const __nv_bfloat16*, const __nv_bfloat16*, const float*,
                                  const float*, __nv_bfloat16*, const AttentionShape&,
                                  cudaStream_t);
template void TcAttentionBackward(const __half*, const __half*, const float*, const float*, __half*,
                                  const AttentionShape&, cudaStream_t);

}  // namespace ztrain::kernels::cuda
