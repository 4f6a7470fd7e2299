// Causal attention backward (FlashAttention-2): probabilities are recomputed per tile from
// the saved log-sum-exp, so nothing of size T x T is stored (Note [Attention tiles]).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/widen.h"

namespace ztrain::kernels {
namespace {

// The backward's blocks: 64 queries by 128 keys. Each query block's Q, dO and dQ rows are
// streamed once per key block, so wider key blocks stream them less often; a key block's dK and
// dV rows, its packed keys and values and the tile's P and dS (320 KiB together at HS = 64)
// stay in L2. Measured with bench/attention_bench at T = 2048 ... 16384: 64 x 128 beats
// 64 x 64 by 5-20 % (more at long T) and 64 x 256 or 32-row query blocks by a few percent.
constexpr cpu::AttentionBlocks kBlocks{64, 128};

struct BackwardScratch {
  float* kt;     // [hs][kv] keys, transposed
  float* vt;     // [hs][kv] values, transposed
  float* p;      // [q][kv] probabilities
  float* ds;     // [q][kv] dP, then dS (scaled)
  float* delta;  // [T] D_i = dO_i . O_i
  float* dk;     // [T][hs] one query head's share of its KV head's dk (grouped heads only)
  float* dv;     // [T][hs] and of its dv

  static int64_t Floats(int64_t hs, int64_t seq, bool grouped) {
    return 2 * hs * kBlocks.kv + 2 * kBlocks.q * kBlocks.kv + seq + (grouped ? 2 * seq * hs : 0);
  }
  BackwardScratch(float* base, int64_t hs, int64_t seq, bool grouped)
      : kt(base),
        vt(kt + hs * kBlocks.kv),
        p(vt + hs * kBlocks.kv),
        ds(p + kBlocks.q * kBlocks.kv),
        delta(ds + kBlocks.q * kBlocks.kv),
        dk(grouped ? delta + seq : nullptr),
        dv(grouped ? dk + seq * hs : nullptr) {}
};

// Pointers to row 0 of one (batch, query head): inputs with their row strides, dq in dqkv,
// dk and dv (rows dkv_stride apart) in dqkv or in scratch.
struct HeadView {
  const float *q, *k, *v, *dout, *out, *lse;
  float *dq, *dk, *dv;
  int64_t dkv_stride;
};

// Overwrites h's dq, dk and dv with the gradients through this query head alone, under the
// key bounds of its batch row.
void HeadBackward(const cpu::AttentionDims& d, const cpu::KeyBounds& keys, const HeadView& h,
                  BackwardScratch& w) {
  const int64_t hs = d.head_size, stride = d.qkv_stride(), ch = d.q_width();
  const int64_t gs = h.dkv_stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int64_t t = 0; t < d.seq; ++t) {
    std::memset(h.dq + t * stride, 0, sizeof(float) * hs);
    std::memset(h.dk + t * gs, 0, sizeof(float) * hs);
    std::memset(h.dv + t * gs, 0, sizeof(float) * hs);
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < hs; ++c) dot += h.dout[t * ch + c] * h.out[t * ch + c];
    w.delta[t] = dot;
  }
  // Key blocks outer: each key/value block is packed once and its dk/dv rows stay hot.
  for (int64_t j0 = 0; j0 < d.seq; j0 += kBlocks.kv) {
    const int nk = static_cast<int>(std::min<int64_t>(kBlocks.kv, d.seq - j0));
    cpu::PackTransposed(h.k + j0 * stride, stride, nk, hs, kBlocks.kv, w.kt);
    cpu::PackTransposed(h.v + j0 * stride, stride, nk, hs, kBlocks.kv, w.vt);
    // The query blocks that see some of these keys (Note [Attention masks]): from the one
    // holding the first row whose last key (i + offset) reaches the block.
    for (int64_t i0 = std::max<int64_t>(0, j0 - keys.offset) / kBlocks.q * kBlocks.q;
         i0 < d.seq && keys.First(i0) < j0 + nk; i0 += kBlocks.q) {
      const int nq = static_cast<int>(std::min<int64_t>(kBlocks.q, d.seq - i0));
      const int n =  // keys seen
          static_cast<int>(std::min<int64_t>(nk, i0 + nq + keys.offset - j0));
      if (n <= 0) continue;
      const int cols = static_cast<int>(cpu::RoundUpToVec(n));
      cpu::TileScores(h.q + i0 * stride, stride, nq, w.kt, kBlocks.kv, cols, hs, scale, w.p,
                      kBlocks.kv);
      cpu::TileScores(h.dout + i0 * ch, ch, nq, w.vt, kBlocks.kv, cols, hs, 1.0f, w.ds, kBlocks.kv);
      for (int i = 0; i < nq; ++i) {  // P = exp(S - lse) under the mask, dS = P (dP - D) scale
        cpu::ProbabilitiesAndGradRow(w.p + i * kBlocks.kv, w.ds + i * kBlocks.kv,
                                     keys.BlockLo(i0 + i, j0, n), keys.BlockHi(i0 + i, j0, n), cols,
                                     h.lse[i0 + i], w.delta[i0 + i], scale);
      }
      // dV_j += sum_i P_ij dO_i;  dK_j += sum_i dS_ij Q_i;  dQ_i += sum_j dS_ij K_j.
      cpu::AccumulateWeightedRows(h.dv + j0 * gs, gs, n, nullptr, w.p, 1, kBlocks.kv, nq,
                                  h.dout + i0 * ch, ch, hs);
      cpu::AccumulateWeightedRows(h.dk + j0 * gs, gs, n, nullptr, w.ds, 1, kBlocks.kv, nq,
                                  h.q + i0 * stride, stride, hs);
      cpu::AccumulateWeightedRows(h.dq + i0 * stride, stride, nq, nullptr, w.ds, kBlocks.kv, 1, n,
                                  h.k + j0 * stride, stride, hs);
    }
  }
}

// dst[t * stride + c] += src[t * hs + c] for every row t and c < hs.
void AddRows(const float* src, int64_t seq, int64_t hs, float* dst, int64_t stride) {
  for (int64_t t = 0; t < seq; ++t) {
#pragma omp simd
    for (int64_t c = 0; c < hs; ++c) dst[t * stride + c] += src[t * hs + c];
  }
}

// The KV head kv of batch row b and the group of query heads it serves, in head order: the
// first head's dk/dv go straight into dqkv, each later head's into scratch and are then added,
// so the KV head's gradient is ((g_0 + g_1) + g_2) + ... whatever the thread count.
void GroupBackward(const cpu::AttentionDims& d, const AttentionMask& mask, const float* qkv,
                   const float* dout, const float* out, const float* lse, float* dqkv, int64_t b,
                   int64_t kv, BackwardScratch& w) {
  const int64_t stride = d.qkv_stride(), hs = d.head_size;
  const cpu::KeyBounds keys(mask, b, d.seq);
  const float* row0 = qkv + b * d.seq * stride;
  float* grad0 = dqkv + b * d.seq * stride;
  for (int64_t r = 0; r < d.group(); ++r) {
    const int64_t h = kv * d.group() + r;
    const int64_t out_off = b * d.seq * d.q_width() + h * hs;
    const bool first = r == 0;
    const HeadView view{row0 + h * hs,
                        row0 + d.k_col(kv),
                        row0 + d.v_col(kv),
                        dout + out_off,
                        out + out_off,
                        lse + (b * d.heads + h) * d.seq,
                        grad0 + h * hs,
                        first ? grad0 + d.k_col(kv) : w.dk,
                        first ? grad0 + d.v_col(kv) : w.dv,
                        first ? stride : hs};
    HeadBackward(d, keys, view, w);
    if (first) continue;
    AddRows(w.dk, d.seq, hs, grad0 + d.k_col(kv), stride);
    AddRows(w.dv, d.seq, hs, grad0 + d.v_col(kv), stride);
  }
}

}  // namespace

// Parallel over (batch, KV head): one thread owns the dk/dv of a KV head and the dq of the
// query heads it serves, so accumulation is race-free and its order fixed.
void CpuOps::AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                               const Tensor& lse, const AttentionHeads& heads,
                               const AttentionMask& mask, const Tensor& dqkv) {
  constexpr const char* kOp = "AttentionBackward";
  if (cpu::AnyHalf(dout, qkv, out, dqkv)) {  // Note [Widening adapter]; lse, mask as they are
    cpu::Widened w(scratch_);
    AttentionBackward(w.In(dout), w.In(qkv), w.In(out), lse, heads, mask, w.Out(dqkv));
    w.Commit();
    return;
  }
  const cpu::AttentionDims d = cpu::CheckAttention(qkv, heads, out, lse, kOp);
  cpu::CheckCpu(dout, out.shape(), kOp, "dout");
  cpu::CheckCpu(dqkv, qkv.shape(), kOp, "dqkv");
  cpu::CheckAttentionMask(mask, d, kOp);
  const int64_t tasks = d.batch * d.kv_heads;
  if (tasks == 0 || d.seq == 0) return;
  const bool grouped = d.group() > 1;
  const int64_t per_thread = BackwardScratch::Floats(d.head_size, d.seq, grouped);
  std::vector<float> scratch(per_thread * omp_get_max_threads());
  const float* qkv_p = qkv.data<float>();
  float* dqkv_p = dqkv.data<float>();
#pragma omp parallel
  {
    BackwardScratch w(scratch.data() + per_thread * omp_get_thread_num(), d.head_size, d.seq,
                      grouped);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      GroupBackward(d, mask, qkv_p, dout.data<float>(), out.data<float>(), lse.data<float>(),
                    dqkv_p, task / d.kv_heads, task % d.kv_heads, w);
    }
  }
}

}  // namespace ztrain::kernels
