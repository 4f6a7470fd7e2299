// Causal attention forward with an online softmax over key blocks (FlashAttention-2).
// Note [Attention tiles] in attention_tile.h explains the tiling.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/widen.h"

namespace ztrain::kernels {
namespace {

// One thread's tile: scores, then probabilities, and the query rows' running statistics.
struct ForwardScratch {
  float* s;      // [q][kv]
  float* max;    // [q] running row max
  float* sum;    // [q] running row sum of exp(score - max)
  float* alpha;  // [q] this block's rescale of what was accumulated before

  static int64_t Floats(const cpu::AttentionBlocks& bl) { return int64_t{bl.q} * bl.kv + 3 * bl.q; }
  ForwardScratch(float* base, const cpu::AttentionBlocks& bl)
      : s(base), max(s + int64_t{bl.q} * bl.kv), sum(max + bl.q), alpha(sum + bl.q) {}
};

// Queries [i0, i0 + nq) of one (batch, query head): q points at row 0 of that head, kt at its
// KV head's packed keys ([kv blocks][HS][bl.kv]), v at row 0 of its values; out at row 0 of
// the head's columns; `keys` bound what each row sees (Note [Attention masks]).
void ForwardQueryBlock(const cpu::AttentionDims& d, const cpu::AttentionBlocks& bl,
                       const cpu::KeyBounds& keys, const float* q, const float* kt, const float* v,
                       int64_t i0, float* out, float* lse, ForwardScratch& w) {
  const int64_t hs = d.head_size, stride = d.qkv_stride(), qw = d.q_width();
  const int nq = static_cast<int>(std::min<int64_t>(bl.q, d.seq - i0));
  const int64_t i_last = i0 + nq - 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int i = 0; i < nq; ++i) std::fill(out + (i0 + i) * qw, out + (i0 + i) * qw + hs, 0.0f);
  std::fill(w.max, w.max + nq, -std::numeric_limits<float>::infinity());
  std::fill(w.sum, w.sum + nq, 0.0f);
  const int64_t key_last = std::min(i_last + keys.offset, d.seq - 1);  // the block's last key
  for (int64_t j0 = keys.First(i0) / bl.kv * bl.kv; j0 <= key_last; j0 += bl.kv) {
    // Only the columns up to the block's last row's last key are computed (Note [Attention
    // tiles]).
    const int n = static_cast<int>(std::min<int64_t>(bl.kv, key_last - j0 + 1));
    const int cols = static_cast<int>(cpu::RoundUpToVec(n));
    cpu::TileScores(q + i0 * stride, stride, nq, kt + j0 * hs, bl.kv, cols, hs, scale, w.s, bl.kv);
    for (int i = 0; i < nq; ++i) {
      w.alpha[i] = cpu::OnlineSoftmaxRow(w.s + int64_t{i} * bl.kv, keys.BlockLo(i0 + i, j0, n),
                                         keys.BlockHi(i0 + i, j0, n), cols, &w.max[i], &w.sum[i]);
    }
    cpu::AccumulateWeightedRows(out + i0 * qw, qw, nq, w.alpha, w.s, bl.kv, 1, n, v + j0 * stride,
                                stride, hs);
  }
  for (int i = 0; i < nq; ++i) {
    float* o = out + (i0 + i) * qw;
    if (w.sum[i] == 0.0f) {  // the row saw no key (an offset block): nothing, and lse -inf
      std::fill(o, o + hs, 0.0f);
      lse[i0 + i] = -std::numeric_limits<float>::infinity();
      continue;
    }
    const float inv = 1.0f / w.sum[i];
#pragma omp simd
    for (int64_t c = 0; c < hs; ++c) o[c] *= inv;
    lse[i0 + i] = w.max[i] + std::log(w.sum[i]);
  }
}

}  // namespace

// Every KV head's keys are packed once (transposed, block by block), then the (batch, query
// head, query block) tasks run in parallel, the blocks late in the sequence (which see the most
// keys) handed out first. Each query head is computed alone, by the same code whatever its
// group, so grouped-query attention gives bit for bit what multi-head attention gives on the
// KV heads repeated, and the block sizes depend on T only, so no result depends on the thread
// count.
void CpuOps::AttentionForward(const Tensor& qkv, const AttentionHeads& heads,
                              const AttentionMask& mask, const Tensor& out, const Tensor& lse) {
  if (cpu::AnyHalf(qkv, out)) {  // Note [Widening adapter]; lse and the mask stay as they are
    cpu::Widened w(scratch_);
    AttentionForward(w.In(qkv), heads, mask, w.Out(out), lse);
    w.Commit();
    return;
  }
  constexpr const char* kOp = "AttentionForward";
  const cpu::AttentionDims d = cpu::CheckAttention(qkv, heads, out, lse, kOp);
  cpu::CheckAttentionMask(mask, d, kOp);
  const cpu::AttentionBlocks bl = cpu::ForwardBlocks(d.seq);
  const int64_t q_blocks = bl.q_blocks(d.seq), kv_blocks = bl.kv_blocks(d.seq);
  const int64_t tasks = d.batch * d.heads * q_blocks;
  if (tasks == 0) return;
  const int64_t hs = d.head_size, stride = d.qkv_stride();
  const int64_t packed_head = kv_blocks * bl.kv * hs;  // one KV head's keys, packed
  std::vector<float> packed(d.batch * d.kv_heads * packed_head);
  const int64_t per_thread = ForwardScratch::Floats(bl);
  std::vector<float> scratch(per_thread * omp_get_max_threads());
  const float* qkv_p = qkv.data<float>();
  float* out_p = out.data<float>();
  float* lse_p = lse.data<float>();
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t p = 0; p < d.batch * d.kv_heads * kv_blocks; ++p) {
      const int64_t bg = p / kv_blocks, j0 = p % kv_blocks * bl.kv;
      const float* k = qkv_p + (bg / d.kv_heads * d.seq + j0) * stride + d.k_col(bg % d.kv_heads);
      cpu::PackTransposed(k, stride, static_cast<int>(std::min<int64_t>(bl.kv, d.seq - j0)), hs,
                          bl.kv, packed.data() + bg * packed_head + j0 * hs);
    }
    ForwardScratch w(scratch.data() + per_thread * omp_get_thread_num(), bl);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t bh = task / q_blocks, qb = q_blocks - 1 - task % q_blocks;
      const int64_t b = bh / d.heads, h = bh % d.heads, g = h / d.group();
      const float* row0 = qkv_p + b * d.seq * stride;
      ForwardQueryBlock(d, bl, cpu::KeyBounds(mask, b, d.seq), row0 + h * hs,
                        packed.data() + (b * d.kv_heads + g) * packed_head, row0 + d.v_col(g),
                        qb * bl.q, out_p + b * d.seq * d.q_width() + h * hs, lse_p + bh * d.seq, w);
    }
  }
}

// Row by row over (batch, head, position): the part's row (widened from 16 bits once) is
// weighed into the running one.
void CpuOps::MergeAttention(const Tensor& out, const Tensor& lse, const Tensor& part,
                            const Tensor& part_lse) {
  constexpr const char* kOp = "MergeAttention";
  if (cpu::AnyHalf(part)) {  // Note [Widening adapter]
    cpu::Widened w(scratch_);
    MergeAttention(out, lse, w.In(part), part_lse);
    return;
  }
  cpu::CheckCpu(out, kOp, "out");
  ZTRAIN_CHECK(out.dim() == 3 && lse.dim() == 3 && lse.size(0) == out.size(0) &&
                   lse.size(2) == out.size(1) && lse.size(1) > 0 && out.size(2) % lse.size(1) == 0,
               kOp, ": out ", ShapeToString(out.shape()), " and lse ", ShapeToString(lse.shape()),
               " are not [B,T,NH*HS] and [B,NH,T]");
  cpu::CheckCpu(lse, lse.shape(), kOp, "lse");
  cpu::CheckCpu(part, out.shape(), kOp, "part");
  cpu::CheckCpu(part_lse, lse.shape(), kOp, "part_lse");
  const int64_t batch = out.size(0), seq = out.size(1), heads = lse.size(1);
  const int64_t hs = out.size(2) / heads;
  float* o = out.data<float>();
  float* l = lse.data<float>();
  const float* p = part.data<float>();
  const float* pl = part_lse.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < batch * heads; ++bh) {
    const int64_t b = bh / heads, h = bh % heads;
    for (int64_t t = 0; t < seq; ++t) {
      float& row_lse = l[bh * seq + t];
      const float add = pl[bh * seq + t];
      if (add == -std::numeric_limits<float>::infinity()) continue;  // nothing seen
      const float merged =
          row_lse == -std::numeric_limits<float>::infinity()
              ? add
              : std::max(row_lse, add) + std::log1p(std::exp(-std::abs(row_lse - add)));
      const float keep = std::exp(row_lse - merged), take = std::exp(add - merged);
      float* dst = o + (b * seq + t) * heads * hs + h * hs;
      const float* src = p + (b * seq + t) * heads * hs + h * hs;
#pragma omp simd
      for (int64_t c = 0; c < hs; ++c) dst[c] = dst[c] * keep + src[c] * take;
      row_lse = merged;
    }
  }
}

}  // namespace ztrain::kernels
