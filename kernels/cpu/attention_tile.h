#pragma once
// Shared pieces of the causal FlashAttention kernels (attention_forward.cc,
// attention_backward.cc): the argument check and the 64 x 64 tile loops.
//
// Note [Attention tiles]: queries and keys are cut into blocks of kTile rows. Key and value
// blocks are copied transposed ([HS][kTile], zero-padded to kTile columns) so that a score
// row is kTile independent dot products computed as one vectorised j-loop per head
// dimension. Query and key blocks have the same size, so a key block before the query block
// is entirely visible and only the diagonal block needs the causal mask; every query row
// sees at least one key in each block it visits. All scratch is per thread and
// O(kTile * HS + T): nothing of size T x T is ever allocated.
#include <cstdint>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace ztrain::kernels::cpu {

inline constexpr int kTile = 64;

// The shape of one attention call (ops.h's layout): query head h reads KV head h / group().
struct AttentionDims {
  int64_t batch, seq, heads, kv_heads, head_size;
  int64_t group() const { return heads / kv_heads; }     // query heads per KV head
  int64_t q_width() const { return heads * head_size; }  // floats between two out rows
  int64_t qkv_stride() const { return (heads + 2 * kv_heads) * head_size; }
  int64_t k_col(int64_t kv_head) const { return (heads + kv_head) * head_size; }
  int64_t v_col(int64_t kv_head) const { return (heads + kv_heads + kv_head) * head_size; }
  int64_t blocks() const { return (seq + kTile - 1) / kTile; }
};

// Checks the heads, qkv [B,T,(NH+2*NKV)*HS], out [B,T,NH*HS] and lse [B,NH,T].
AttentionDims CheckAttention(const Tensor& qkv, const AttentionHeads& heads, const Tensor& out,
                             const Tensor& lse, const char* op);

// dst[d * kTile + j] = src[j * stride + d] for j < n, 0 for n <= j < kTile.
inline void LoadTransposed(const float* src, int64_t stride, int n, int64_t hs, float* dst) {
  for (int64_t d = 0; d < hs; ++d) {
    float* row = dst + d * kTile;
    for (int j = 0; j < n; ++j) row[j] = src[j * stride + d];
    for (int j = n; j < kTile; ++j) row[j] = 0.0f;
  }
}

// Note [Attention microkernels]: the two loops below are register-blocked with GCC/Clang
// vector types (16 floats: one AVX-512 register, two AVX2 ones). Written with plain arrays,
// or with memcpy into vector arrays, GCC keeps the accumulators on the stack and the loops
// turn load/store bound. Vectors are read and written in place through the unaligned,
// may_alias type Vec16U and never passed by value, so the ABI does not depend on -march.
typedef float Vec16 __attribute__((vector_size(64)));
typedef float Vec16U __attribute__((vector_size(64), aligned(4), may_alias));
inline constexpr int kVec = 16;
inline constexpr int kTileVecs = kTile / kVec;

// s[i * kTile + j] = scale * (a_i . b_j) for rows i in [i0, i0 + R) (a_i stride apart) and
// all kTile columns of the transposed tile bt. R rows at once reuse each bt load R times.
template <int R>
inline void TileScoreRows(const float* a, int64_t stride, int i0, const float* bt, int64_t hs,
                          float scale, float* s) {
  Vec16 acc[R][kTileVecs] = {};
  for (int64_t d = 0; d < hs; ++d) {
    const float* b = bt + d * kTile;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float av = a[(i0 + r) * stride + d];
#pragma GCC unroll 4
      for (int v = 0; v < kTileVecs; ++v) {
        acc[r][v] += av * *reinterpret_cast<const Vec16U*>(b + v * kVec);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kTileVecs; ++v) {
      *reinterpret_cast<Vec16U*>(s + (i0 + r) * kTile + v * kVec) = acc[r][v] * scale;
    }
  }
}

// Scores of the first n rows of a against the transposed tile bt (kTile columns).
inline void TileScores(const float* a, int64_t stride, int n, const float* bt, int64_t hs,
                       float scale, float* s) {
  int i = 0;
  for (; i + 4 <= n; i += 4) TileScoreRows<4>(a, stride, i, bt, hs, scale, s);
  for (; i < n; ++i) TileScoreRows<1>(a, stride, i, bt, hs, scale, s);
}

// dst_r += sum over c < ncols of w[r * w_row + c * w_col] * src_c, for rows r < nrows;
// dst_r and src_c are hs floats, dst_stride / src_stride apart. Zero weights (masked
// entries) are skipped. Head sizes that are multiples of 64 keep 64 columns of dst_r in
// registers across the whole c loop.
inline void AccumulateWeightedRows(float* dst, int64_t dst_stride, int nrows, const float* w,
                                   int64_t w_row, int64_t w_col, int ncols, const float* src,
                                   int64_t src_stride, int64_t hs) {
  constexpr int64_t kChunk = kVec * 4;
  const bool chunked = hs % kChunk == 0;
  for (int r = 0; r < nrows; ++r) {
    float* out = dst + r * dst_stride;
    const float* wr = w + r * w_row;
    for (int64_t d0 = 0; chunked && d0 < hs; d0 += kChunk) {
      Vec16 acc[4];
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) acc[v] = *reinterpret_cast<const Vec16U*>(out + d0 + v * kVec);
      for (int c = 0; c < ncols; ++c) {
        const float wv = wr[c * w_col];
        if (wv == 0.0f) continue;
        const float* in = src + c * src_stride + d0;
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) acc[v] += wv * *reinterpret_cast<const Vec16U*>(in + v * kVec);
      }
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) *reinterpret_cast<Vec16U*>(out + d0 + v * kVec) = acc[v];
    }
    for (int c = 0; !chunked && c < ncols; ++c) {
      const float wv = wr[c * w_col];
      if (wv == 0.0f) continue;
      const float* in = src + c * src_stride;
#pragma omp simd
      for (int64_t d = 0; d < hs; ++d) out[d] += wv * in[d];
    }
  }
}

}  // namespace ztrain::kernels::cpu
