// Token (+ position) embedding, forward and deterministic backward. The position table is
// optional: a model without one (Llama: RoPE) passes an undefined wpe / dwpe. The backward
// also takes an undefined dwte (a frozen table, Note [Frozen parameters] in ops.h). The token
// table may be one rank's slice of a vocabulary-parallel embedding (VocabSlice in ops.h): a
// token of another slice reads (and its gradient adds into) nothing, a zero row.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/check.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/widen.h"
#include "kernels/vocab_slice_check.h"

namespace ztrain::kernels {
namespace {

constexpr int64_t kChannelBlock = 32;  // channels one backward task owns (two cache lines)

struct EmbeddingDims {
  int64_t batch, seq, channels;
  int64_t vocab;        // tokens must lie in [0, vocab)
  int64_t begin, rows;  // the table holds ids [begin, begin + rows)
  // The table row of token `t`, or -1 when the table (a slice) does not hold it.
  int64_t RowOf(int32_t t) const { return t >= begin && t < begin + rows ? t - begin : -1; }
};

// Checks every token before any output is written, naming the first bad one.
void CheckTokens(const int32_t* tokens, const EmbeddingDims& d, const char* op) {
  for (int64_t i = 0; i < d.batch * d.seq; ++i) {
    ZTRAIN_CHECK(tokens[i] >= 0 && tokens[i] < d.vocab, op, ": token ", tokens[i],
                 " at position [b=", i / d.seq, ", t=", i % d.seq, "] is outside [0, ", d.vocab,
                 "); the embedding table wte has ", d.vocab, " rows");
  }
}

// wpe (undefined: no position table) is [maxT >= T, C].
void CheckPositions(const Tensor& wpe, const EmbeddingDims& d, const char* op,
                    const char* wpe_name) {
  if (!wpe.defined()) return;
  cpu::CheckCpuFloat(wpe, op, wpe_name);
  ZTRAIN_CHECK(wpe.dim() == 2 && wpe.size(1) == d.channels && wpe.size(0) >= d.seq, op, ": ",
               wpe_name, " has shape ", ShapeToString(wpe.shape()), ", expected [maxT >= ", d.seq,
               ", ", d.channels, "]");
}

// wpe may be undefined (no position table).
EmbeddingDims CheckEmbeddingArgs(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                 const Tensor& act, const VocabSlice& slice, const char* op,
                                 const char* wte_name, const char* wpe_name,
                                 const char* act_name) {
  cpu::CheckCpu(tokens, op, "tokens", DType::kI32);
  ZTRAIN_CHECK(tokens.dim() == 2, op, ": tokens must be [B, T], got ",
               ShapeToString(tokens.shape()));
  cpu::CheckCpuFloat(wte, op, wte_name);
  ZTRAIN_CHECK(wte.dim() == 2, op, ": ", wte_name, " must be [Vp, C], got ",
               ShapeToString(wte.shape()));
  CheckTableSlice(slice, wte.size(0), op, wte_name);
  const EmbeddingDims d{tokens.size(0), tokens.size(1), wte.size(1),
                        slice.vocab,    slice.begin,    wte.size(0)};
  CheckPositions(wpe, d, op, wpe_name);
  cpu::CheckCpuFloat(act, {d.batch, d.seq, d.channels}, op, act_name);
  CheckTokens(tokens.data<int32_t>(), d, op);
  return d;
}

// The backward's sizes when dwte is undefined (a frozen token table, Note [Frozen
// parameters] in ops.h): C comes from dout and the tokens' values are not read.
EmbeddingDims CheckFrozenTableArgs(const Tensor& dout, const Tensor& tokens, const Tensor& dwpe,
                                   const char* op) {
  cpu::CheckCpu(tokens, op, "tokens", DType::kI32);
  ZTRAIN_CHECK(tokens.dim() == 2, op, ": tokens must be [B, T], got ",
               ShapeToString(tokens.shape()));
  cpu::CheckCpuFloat(dout, op, "dout");
  ZTRAIN_CHECK(dout.dim() == 3 && dout.size(0) == tokens.size(0) && dout.size(1) == tokens.size(1),
               op, ": dout has shape ", ShapeToString(dout.shape()), ", expected [", tokens.size(0),
               ", ", tokens.size(1), ", C] for tokens ", ShapeToString(tokens.shape()));
  const EmbeddingDims d{tokens.size(0), tokens.size(1), dout.size(2), 0, 0, 0};
  CheckPositions(dwpe, d, op, "dwpe");
  return d;
}

// The forward with a 16-bit table or output: each row of wte and wpe it reads is widened on
// the fly (never the whole [Vp, C] table), added in fp32 and rounded once into out, so the
// result is the fp32 kernel's on the widened tables (Note [Widening adapter]). Without wpe
// the wte row is rounded once into out; a token outside the slice reads a zero row.
void EmbeddingForwardRows(const EmbeddingDims& d, const int32_t* tok, const Tensor& wte,
                          const Tensor& wpe, const Tensor& out) {
  const int64_t rows = d.batch * d.seq, ch = d.channels;
  const auto* te = static_cast<const char*>(wte.data());
  const auto* pe = static_cast<const char*>(wpe.data());
  auto* o = static_cast<char*>(out.data());
  const int64_t te_row = ch * DTypeSize(wte.dtype()), pe_row = ch * DTypeSize(wpe.dtype());
  const int64_t o_row = ch * DTypeSize(out.dtype());
  std::vector<float> scratch(2 * ch * omp_get_max_threads());
#pragma omp parallel if (rows * ch >= cpu::kParallelGrain)
  {
    float* t = scratch.data() + 2 * ch * omp_get_thread_num();
    float* p = t + ch;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t row = d.RowOf(tok[i]);
      if (row >= 0) {
        cpu::WidenSerial(te + row * te_row, wte.dtype(), t, ch);
      } else {
        std::fill(t, t + ch, 0.0f);
      }
      if (pe != nullptr) {
        cpu::WidenSerial(pe + (i % d.seq) * pe_row, wpe.dtype(), p, ch);
#pragma omp simd
        for (int64_t c = 0; c < ch; ++c) t[c] += p[c];
      }
      cpu::NarrowSerial(t, o + i * o_row, out.dtype(), ch);
    }
  }
}

}  // namespace

void CpuOps::EmbeddingForward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                              const Tensor& out, const VocabSlice& slice) {
  const EmbeddingDims d = CheckEmbeddingArgs(tokens, wte, wpe, out, slice, "EmbeddingForward",
                                             "wte", "wpe", "out");
  const int32_t* tok = tokens.data<int32_t>();
  if (cpu::AnyHalf(wte, wpe, out)) return EmbeddingForwardRows(d, tok, wte, wpe, out);
  const float* te = wte.data<float>();
  const float* pe = wpe.data<float>();
  float* o = out.data<float>();
  const int64_t rows = d.batch * d.seq, ch = d.channels;
#pragma omp parallel for schedule(static) if (rows * ch >= cpu::kParallelGrain)
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t row = d.RowOf(tok[i]);
    float* o_row = o + i * ch;
    if (row < 0) {  // another slice's token: a zero row, plus the position's
      if (pe == nullptr) {
        std::fill(o_row, o_row + ch, 0.0f);
      } else {
        std::copy(pe + (i % d.seq) * ch, pe + (i % d.seq + 1) * ch, o_row);
      }
      continue;
    }
    const float* t_row = te + row * ch;
    if (pe == nullptr) {
      std::copy(t_row, t_row + ch, o_row);
      continue;
    }
    const float* p_row = pe + (i % d.seq) * ch;
#pragma omp simd
    for (int64_t c = 0; c < ch; ++c) o_row[c] = t_row[c] + p_row[c];
  }
}

// Parallel over channel blocks; each task walks every token in order, so repeated tokens add
// up in the same order for any thread count and no two threads touch the same dwte element.
void CpuOps::EmbeddingBackward(const Tensor& dout, const Tensor& tokens, const Tensor& dwte,
                               const Tensor& dwpe, const VocabSlice& slice) {
  constexpr const char* kOp = "EmbeddingBackward";
  if (!dwte.defined() && !dwpe.defined()) {  // both tables frozen: nothing to accumulate
    CheckFrozenTableArgs(dout, tokens, dwpe, kOp);
    return;
  }
  if (cpu::AnyHalf(dout, dwte, dwpe)) {  // Note [Widening adapter]: dwte is widened whole
    cpu::Widened w(scratch_);
    EmbeddingBackward(w.In(dout), tokens, w.InOut(dwte), w.InOut(dwpe), slice);
    w.Commit();
    return;
  }
  const EmbeddingDims d =
      dwte.defined()
          ? CheckEmbeddingArgs(tokens, dwte, dwpe, dout, slice, kOp, "dwte", "dwpe", "dout")
          : CheckFrozenTableArgs(dout, tokens, dwpe, kOp);
  const int32_t* tok = tokens.data<int32_t>();
  const float* g = dout.data<float>();
  float* gte = dwte.data<float>();
  float* gpe = dwpe.data<float>();
  const int64_t rows = d.batch * d.seq, ch = d.channels;
  // Each table is skipped when its gradient is undefined (no position table, or frozen).
  const int64_t blocks = gte != nullptr ? (ch + kChannelBlock - 1) / kChannelBlock : 0;
  const int64_t pe_rows = gpe != nullptr ? d.seq : 0;
#pragma omp parallel if (rows * ch >= cpu::kParallelGrain)
  {
#pragma omp for schedule(static) nowait
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t c0 = blk * kChannelBlock;
      const int64_t width = std::min(kChannelBlock, ch - c0);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t row = d.RowOf(tok[i]);
        if (row < 0) continue;  // another slice's token
        float* dst = gte + row * ch + c0;
        const float* src = g + i * ch + c0;
#pragma omp simd
        for (int64_t c = 0; c < width; ++c) dst[c] += src[c];
      }
    }
    // dwpe[t] += sum over b of dout[b, t]: positions are independent.
#pragma omp for schedule(static)
    for (int64_t t = 0; t < pe_rows; ++t) {
      float* dst = gpe + t * ch;
      for (int64_t b = 0; b < d.batch; ++b) {
        const float* src = g + (b * d.seq + t) * ch;
#pragma omp simd
        for (int64_t c = 0; c < ch; ++c) dst[c] += src[c];
      }
    }
  }
}

}  // namespace ztrain::kernels
