// MegatronLinears' vocabulary-parallel embedding: each rank looks up the tokens of its
// vocabulary slice, writes zero rows for the others, and one all-reduce assembles the whole
// token embedding. Exactly one rank contributes each row and the others add +0, so the sum is
// bit-exact.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "nn/layer_context.h"
#include "parallel/tensor/tp_common.h"
#include "parallel/tensor/megatron_linears.h"

namespace ztrain::tensor {
namespace {

constexpr int64_t kChannelBlock = 32;  // channels one backward task owns (two cache lines)

// Checks every token against the whole padded vocabulary before anything is written or
// issued: the ranks see the same tokens, so they all throw together and no rank is left
// waiting in a collective.
void CheckTokens(const Tensor& tokens, int64_t padded_vocab) {
  ZTRAIN_CHECK(tokens.dtype() == DType::kI32 && tokens.dim() == 2,
               "vocabulary-parallel embedding: tokens must be int32 [B, T], got ",
               ShapeToString(tokens.shape()));
  const int32_t* tok = tokens.data<int32_t>();
  const int64_t seq = tokens.size(1);
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    ZTRAIN_CHECK(tok[i] >= 0 && tok[i] < padded_vocab, "vocabulary-parallel embedding: token ", tok[i],
                 " at position [b=", i / seq, ", t=", i % seq, "] is outside [0, ", padded_vocab,
                 "); the embedding table wte has ", padded_vocab, " rows");
  }
}

// The fp32 gradients of the embedding's tables on this rank: rows [vocab_begin, vocab_begin +
// local_vocab) of wte, and the whole wpe; a null one is not accumulated.
struct TableGrads {
  float* dwte;
  int64_t vocab_begin, local_vocab;
  float* dwpe;
};

// dwte[token - vocab_begin] += g[i] for the tokens of this slice, dwpe[t] += sum over b of
// g[b, t]. Parallel over blocks of channels: every task walks the tokens in order, so
// repeated tokens add up in the same order whatever the thread count (deterministic, like the
// CPU kernel), and no two tasks touch the same element.
void AccumulateTableGrads(const nn::MicroBatch& mb, const float* g, int64_t c,
                          const TableGrads& out) {
  const int32_t* tok = mb.tokens.data<int32_t>();
  const int64_t rows = mb.tokens.numel(), batch = mb.B(), seq = mb.T();
  const bool tokens = out.dwte != nullptr, positions = out.dwpe != nullptr;
  const int64_t blocks = (c + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (rows * c >= detail::kParallelGrain)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kChannelBlock, j1 = std::min(c, j0 + kChannelBlock);
    for (int64_t i = 0; i < rows && tokens; ++i) {
      const int64_t local = tok[i] - out.vocab_begin;
      if (local < 0 || local >= out.local_vocab) continue;
      for (int64_t j = j0; j < j1; ++j) out.dwte[local * c + j] += g[i * c + j];
    }
    for (int64_t t = 0; t < seq && positions; ++t) {
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t j = j0; j < j1; ++j) out.dwpe[t * c + j] += g[(b * seq + t) * c + j];
      }
    }
  }
}

}  // namespace

void MegatronLinears::EmbeddingForward(nn::LayerContext& ctx, const nn::MicroBatch& mb,
                                       const Tensor& wte, const Tensor& wpe,
                                       const Tensor& output) const {
  detail::CheckHostOps(ctx, "the vocabulary-parallel embedding");
  const int64_t local_vocab = wte.size(0), vocab_begin = local_vocab * tp_.rank();
  CheckTokens(mb.tokens, local_vocab * tp_.size());
  const int64_t rows = mb.tokens.numel(), seq = mb.T(), c = wte.size(1);
  CheckTensor(output, ctx.dtype(), {mb.B(), seq, c}, "embedding output");
  const int32_t* tok = mb.tokens.data<int32_t>();
  // The rows are summed in fp32 and rounded once, with the position embedding (Note [Tensor
  // parallelism in 16 bits]).
  Buffer hold;
  const Tensor sum = detail::Fp32Partial(ctx, output, hold);
  float* s = sum.data<float>();
#pragma omp parallel for schedule(static) if (rows * c >= detail::kParallelGrain)
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t local = tok[i] - vocab_begin;
    if (local >= 0 && local < local_vocab) {
      detail::LoadElements(wte, local * c, c, s + i * c);
    } else {
      std::fill(s + i * c, s + (i + 1) * c, 0.0f);
    }
  }
  tp_.AllReduce(sum)->Wait();
  // The position embedding is whole on every rank: added after the sum, so once.
#pragma omp parallel if (rows * c >= detail::kParallelGrain)
  {
    std::vector<float> row(static_cast<size_t>(c));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      if (wpe.defined()) {
        detail::LoadElements(wpe, (i % seq) * c, c, row.data());
      } else {
        std::fill(row.begin(), row.end(), 0.0f);  // no position table: the rows alone
      }
      for (int64_t j = 0; j < c; ++j) row[j] = s[i * c + j] + row[j];
      detail::StoreElements(row.data(), output, i * c, c);
    }
  }
}

// No collective: doutput is replicated, so each rank accumulates its own wte rows and the
// same (whole) wpe gradient as every other rank. 16-bit arguments are widened into fp32
// workspace and the gradients rounded back once, as the CPU kernel's adapter does. An
// undefined dwte or dwpe (a frozen table, or no position table) is skipped (Note [Frozen
// parameters] in kernels/ops.h).
void MegatronLinears::EmbeddingBackward(nn::LayerContext& ctx, const nn::MicroBatch& mb,
                                        const Tensor& doutput, const Tensor& dwte_slice,
                                        const Tensor& dwpe_whole) const {
  detail::CheckHostOps(ctx, "the vocabulary-parallel embedding");
  const bool tokens = dwte_slice.defined(), positions = dwpe_whole.defined();
  if (!tokens && !positions) return;
  const int64_t c = (tokens ? dwte_slice : dwpe_whole).size(1);
  CheckTensor(doutput, ctx.dtype(), {mb.B(), mb.T(), c}, "embedding doutput");
  kernels::Ops& ops = ctx.ops();
  const auto fp32 = [&](const Tensor& t) {
    if (!t.defined() || t.dtype() == DType::kF32) return t;
    const Tensor w = ctx.Scratch(DType::kF32, t.shape());
    ops.Copy(t, w);
    return w;
  };
  const Tensor g32 = fp32(doutput), dwte32 = fp32(dwte_slice), dwpe32 = fp32(dwpe_whole);
  const int64_t local_vocab = tokens ? dwte_slice.size(0) : 0;
  const TableGrads grads{dwte32.data<float>(), local_vocab * tp_.rank(), local_vocab,
                         dwpe32.data<float>()};
  AccumulateTableGrads(mb, g32.data<float>(), c, grads);
  if (tokens && dwte32.data() != dwte_slice.data()) ops.Copy(dwte32, dwte_slice);
  if (positions && dwpe32.data() != dwpe_whole.data()) ops.Copy(dwpe32, dwpe_whole);
}

}  // namespace ztrain::tensor
