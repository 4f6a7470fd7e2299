#pragma once
// Shared pieces of the causal FlashAttention kernels (attention_forward.cc,
// attention_backward.cc): the argument check, the block sizes and the two register-blocked
// products every tile is made of.
//
// Note [Attention tiles]: queries are cut into blocks of `q` rows and keys into blocks of `kv`
// rows (AttentionBlocks, chosen by length as PyTorch's CPU flash attention does). A tile is one
// query block against one key block: its scores S = scale * Q K^T come from keys packed
// transposed ([HS][kv], zero-padded to a multiple of 16 columns) so that a score row is
// vectorised along the keys, and its products with V, dO, Q or K (P V, P^T dO, dS^T Q, dS K)
// read those rows in place. Key blocks wholly above the causal diagonal are never visited; in
// the diagonal ones only the columns some row of the block sees are computed (rounded up to
// 16) and the mask zeroes the rest. A query row may see no key of a visited block (a key
// block wider than the query block): its probabilities there are 0 and its running softmax
// is left alone. All scratch is O(T * HS) (the forward's packed keys) plus per-thread tiles:
// nothing of size T x T is ever allocated.
//
// Note [Attention masks]: every mask (ops.h's AttentionMask) leaves query i an interval of keys,
// [First(i), i]: a sliding window starts it at i - window + 1, a packed document at the
// document's first token. First never decreases with i (a window slides forward; a new document
// starts after the last), so the keys the rows of a query block see form one interval,
// [First(i0), last row], and so do the rows that see some key of a key block. The forward
// starts at the key block holding First(i0); the backward stops at the first query block whose
// first row starts after the key block. Blocks wholly outside are never visited; inside a
// visited block each row's probabilities are 0 outside its interval.
#include <algorithm>
#include <cstdint>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace ztrain::kernels::cpu {

// The shape of one attention call (ops.h's layout): query head h reads KV head h / group().
struct AttentionDims {
  int64_t batch, seq, heads, kv_heads, head_size;
  int64_t group() const { return heads / kv_heads; }     // query heads per KV head
  int64_t q_width() const { return heads * head_size; }  // floats between two out rows
  int64_t qkv_stride() const { return (heads + 2 * kv_heads) * head_size; }
  int64_t k_col(int64_t kv_head) const { return (heads + kv_head) * head_size; }
  int64_t v_col(int64_t kv_head) const { return (heads + kv_heads + kv_head) * head_size; }
};

// Checks the heads, qkv [B,T,(NH+2*NKV)*HS], out [B,T,NH*HS] and lse [B,NH,T].
AttentionDims CheckAttention(const Tensor& qkv, const AttentionHeads& heads, const Tensor& out,
                             const Tensor& lse, const char* op);

// Checks a mask against the call: window >= 0; positions, when defined, int32 [B, T] on the
// host, each row a run of documents (..., 0, 1, 2, ..., 0, 1, ...; the first may start above
// 0).
void CheckAttentionMask(const AttentionMask& mask, const AttentionDims& d, const char* op);

// The first key each query of one batch row sees (Note [Attention masks]), and the last: query
// i sits at key index i + offset (ops.h's AttentionMask::offset; 0 for self-attention).
struct KeyBounds {
  int64_t window = 0;                  // 0: no window
  const int32_t* positions = nullptr;  // the row's positions within documents, or null
  int64_t offset = 0;

  KeyBounds(const AttentionMask& mask, int64_t b, int64_t seq)
      : window(mask.window),
        positions(mask.positions.defined() ? mask.positions.data<int32_t>() + b * seq : nullptr),
        offset(mask.offset) {}
  int64_t First(int64_t i) const {
    const int64_t at = i + offset;
    int64_t first = window > 0 ? std::max<int64_t>(0, at - window + 1) : 0;
    if (positions != nullptr) first = std::max(first, at - positions[i]);
    return first;
  }
  // Row i's visible keys within the block of n keys from j0, as [lo, hi) in the block (empty
  // when lo >= hi).
  int BlockLo(int64_t i, int64_t j0, int n) const {
    return static_cast<int>(std::clamp<int64_t>(First(i) - j0, 0, n));
  }
  int BlockHi(int64_t i, int64_t j0, int n) const {
    return static_cast<int>(std::clamp<int64_t>(i + offset - j0 + 1, 0, n));
  }
};

inline constexpr int kVec = 16;  // floats in one vector (Note [Attention microkernels])

inline int64_t RoundUpToVec(int64_t n) { return (n + kVec - 1) / kVec * kVec; }
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows per query block and per key block (Note [Attention tiles]); both multiples of 16.
struct AttentionBlocks {
  int q, kv;
  int64_t q_blocks(int64_t seq) const { return CeilDiv(seq, q); }
  int64_t kv_blocks(int64_t seq) const { return CeilDiv(seq, kv); }
};
// The forward's blocks for a sequence of `seq` (depends on nothing else: the result does not
// depend on the thread count). The backward's are fixed (attention_backward.cc).
AttentionBlocks ForwardBlocks(int64_t seq);

// dst[d * cols + j] = src[j * stride + d] for j < n and d < hs; 0 for n <= j < cols.
void PackTransposed(const float* src, int64_t stride, int n, int64_t hs, int cols, float* dst);

// Scores of a tile: s[r * lds + j] = scale * sum_d a[r * a_stride + d] * bt[d * ldb + j] for
// rows r < rows and columns j < cols (a multiple of 16; bt holds them, zero-padded).
void TileScores(const float* a, int64_t a_stride, int rows, const float* bt, int64_t ldb, int cols,
                int64_t hs, float scale, float* s, int64_t lds);

// Folds one query row's scores s[0, cols) (cols a multiple of 16) into its running max and
// sum, in place: keys [lo, hi) are visible and become exp(s - max), the others 0. Returns the
// factor by which the row's output so far must be rescaled: 1 when lo >= hi (the row sees none
// of these keys and its statistics are left alone), 0 on the row's first block.
float OnlineSoftmaxRow(float* s, int lo, int hi, int cols, float* row_max, float* row_sum);

// The backward's row of a tile, in place over cols (a multiple of 16): p = exp(p - lse) where
// the key is visible ([lo, hi)), else 0; ds = p * (ds - delta) * scale.
void ProbabilitiesAndGradRow(float* p, float* ds, int lo, int hi, int cols, float lse, float delta,
                             float scale);

// A tile's product with rows of V, dO, Q or K: for rows r < rows and x < hs,
//   dst[r * ldd + x] = alpha_r * dst[r * ldd + x] + sum_{c < n} w[r * w_row + c * w_col] * src[c *
//   lds + x]
// where alpha_r = alpha[r], or 1 when alpha is null (the forward's rescale of its running
// output rides along with the load of the accumulators).
void AccumulateWeightedRows(float* dst, int64_t ldd, int rows, const float* alpha, const float* w,
                            int64_t w_row, int64_t w_col, int n, const float* src, int64_t lds,
                            int64_t hs);

}  // namespace ztrain::kernels::cpu
