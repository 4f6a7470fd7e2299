// Causal attention forward with an online softmax over key tiles (FlashAttention-2).
// Note [Attention tiles] in attention_tile.h explains the tiling.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/widen.h"

namespace ztrain::kernels {
namespace {

using cpu::kTile;

// One thread's tiles: transposed keys, scores, the output accumulator and row statistics.
struct ForwardScratch {
  float* kt;   // [hs][kTile]
  float* s;    // [kTile][kTile]
  float* acc;  // [kTile][hs]
  float* max;  // [kTile] running row max
  float* sum;  // [kTile] running row sum of exp(score - max)

  static int64_t Floats(int64_t hs) { return 2 * hs * kTile + kTile * kTile + 2 * kTile; }
  ForwardScratch(float* base, int64_t hs)
      : kt(base), s(kt + hs * kTile), acc(s + kTile * kTile), max(acc + kTile * hs),
        sum(max + kTile) {}
};

// Folds the scores of row i against keys [0, n) (already scaled) into its running
// max / sum / output, rescaling what was accumulated before when the max grows.
void OnlineSoftmaxRow(float* si, int n, const float* v, int64_t stride, int64_t hs,
                      float* row_max, float* row_sum, float* acc) {
  float block_max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : block_max)
  for (int j = 0; j < n; ++j) block_max = std::max(block_max, si[j]);
  const float new_max = std::max(*row_max, block_max);
  const float alpha = std::exp(*row_max - new_max);  // 0 on the first block (max = -inf)
  float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
  for (int j = 0; j < n; ++j) {
    si[j] = cpu::FastExp(si[j] - new_max);
    block_sum += si[j];
  }
  *row_sum = *row_sum * alpha + block_sum;
  *row_max = new_max;
  if (alpha != 1.0f) {
#pragma omp simd
    for (int64_t d = 0; d < hs; ++d) acc[d] *= alpha;
  }
  cpu::AccumulateWeightedRows(acc, hs, 1, si, 0, 1, n, v, stride, hs);
}

// Queries [i0, i0 + nq) of one (batch, query head): q points at row 0 of that head, k and v
// at row 0 of the KV head it reads; out at row 0 of its columns.
void ForwardQueryBlock(const cpu::AttentionDims& d, const float* q, const float* k,
                       const float* v, int64_t i0, float* out, float* lse, ForwardScratch& w) {
  const int64_t hs = d.head_size, stride = d.qkv_stride();
  const int nq = static_cast<int>(std::min<int64_t>(kTile, d.seq - i0));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::fill(w.acc, w.acc + nq * hs, 0.0f);
  std::fill(w.max, w.max + nq, -std::numeric_limits<float>::infinity());
  std::fill(w.sum, w.sum + nq, 0.0f);
  for (int64_t j0 = 0; j0 <= i0; j0 += kTile) {
    const int nk = static_cast<int>(std::min<int64_t>(kTile, d.seq - j0));
    cpu::LoadTransposed(k + j0 * stride, stride, nk, hs, w.kt);
    cpu::TileScores(q + i0 * stride, stride, nq, w.kt, hs, scale, w.s);
    for (int i = 0; i < nq; ++i) {
      const int n = static_cast<int>(std::min<int64_t>(nk, i0 + i - j0 + 1));  // causal
      OnlineSoftmaxRow(w.s + i * kTile, n, v + j0 * stride, stride, hs, &w.max[i], &w.sum[i],
                       w.acc + i * hs);
    }
  }
  for (int i = 0; i < nq; ++i) {
    const float inv = 1.0f / w.sum[i];
    float* o = out + (i0 + i) * d.q_width();
#pragma omp simd
    for (int64_t c = 0; c < hs; ++c) o[c] = w.acc[i * hs + c] * inv;
    lse[i0 + i] = w.max[i] + std::log(w.sum[i]);
  }
}

}  // namespace

// Parallel over (batch, query head, query block); the blocks late in the sequence see the
// most keys and are handed out first. Each query head is computed alone, by the same code
// whatever its group, so grouped-query attention gives bit for bit what multi-head attention
// gives on the KV heads repeated.
void CpuOps::AttentionForward(const Tensor& qkv, const AttentionHeads& heads, const Tensor& out,
                              const Tensor& lse) {
  if (cpu::AnyHalf(qkv, out)) {  // Note [Widening adapter]; lse stays fp32
    cpu::Widened w(scratch_);
    AttentionForward(w.In(qkv), heads, w.Out(out), lse);
    w.Commit();
    return;
  }
  const cpu::AttentionDims d = cpu::CheckAttention(qkv, heads, out, lse, "AttentionForward");
  const int64_t blocks = d.blocks(), tasks = d.batch * d.heads * blocks;
  if (tasks == 0) return;
  const int64_t per_thread = ForwardScratch::Floats(d.head_size);
  std::vector<float> scratch(per_thread * omp_get_max_threads());
  const float* qkv_p = qkv.data<float>();
  float* out_p = out.data<float>();
  float* lse_p = lse.data<float>();
#pragma omp parallel
  {
    ForwardScratch w(scratch.data() + per_thread * omp_get_thread_num(), d.head_size);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t bh = task / blocks, qb = blocks - 1 - task % blocks;
      const int64_t b = bh / d.heads, h = bh % d.heads, g = h / d.group();
      const float* row0 = qkv_p + b * d.seq * d.qkv_stride();
      ForwardQueryBlock(d, row0 + h * d.head_size, row0 + d.k_col(g), row0 + d.v_col(g), qb * kTile,
                        out_p + b * d.seq * d.q_width() + h * d.head_size, lse_p + bh * d.seq, w);
    }
  }
}

}  // namespace ztrain::kernels
