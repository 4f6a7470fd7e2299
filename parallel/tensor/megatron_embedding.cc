// MegatronLinears' vocabulary-parallel embedding: each rank looks up the tokens of its
// vocabulary slice, writes zero rows for the others, and one all-reduce assembles the whole
// token embedding. Exactly one rank contributes each row and the others add +0, so the sum is
// bit-exact. The lookups are the ops' (EmbeddingForward/Backward over a VocabSlice), so the
// layer runs on either backend.
#include "core/error.h"
#include "nn/layer_context.h"
#include "parallel/tensor/megatron_linears.h"
#include "parallel/tensor/tp_common.h"

namespace ztrain::tensor {
namespace {

// This rank's rows of the whole padded table: the embedding takes every padded id (the ops
// check each token against all of them, so the ranks, which see the same tokens, throw
// together before the collective).
kernels::VocabSlice SliceOf(const Tensor& table_slice, const comm::Communicator& tp) {
  const int64_t local = table_slice.size(0);
  return {local * tp.rank(), local * tp.size()};
}

}  // namespace

void MegatronLinears::EmbeddingForward(nn::LayerContext& ctx, const nn::MicroBatch& mb,
                                       const Tensor& wte, const Tensor& wpe,
                                       const Tensor& output) const {
  const int64_t seq = mb.T(), c = wte.size(1);
  CheckTensor(output, ctx.dtype(), {mb.B(), seq, c}, "embedding output");
  kernels::Ops& ops = ctx.ops();
  // The rows are summed in fp32 and rounded once, with the position embedding (Note [Tensor
  // parallelism in 16 bits]).
  Buffer hold;
  const Tensor sum = detail::Fp32Partial(ctx, output, hold);
  ops.EmbeddingForward(mb.tokens, wte, Tensor(), sum, SliceOf(wte, tp_));
  tp_.AllReduce(sum)->Wait();
  // The position embedding is whole on every rank: added after the sum, so once; its rows
  // [0, T) repeat over the batch, or with packed documents each token takes the row of its
  // document position.
  if (wpe.defined() && mb.positions.defined()) {
    ops.AddBiasAndResidual(sum, Tensor(), nn::PositionRows(ctx, mb, wpe), output);
    return;
  }
  const Tensor positions = wpe.defined() ? wpe.Flat(0, {seq, c}) : Tensor();
  ops.AddBiasAndResidual(sum, positions, Tensor(), output);
}

// No collective: doutput is replicated, so each rank accumulates its own wte rows and the
// same (whole) wpe gradient as every other rank. An undefined dwte or dwpe (a frozen table,
// or no position table) is skipped (Note [Frozen parameters] in kernels/ops.h).
void MegatronLinears::EmbeddingBackward(nn::LayerContext& ctx, const nn::MicroBatch& mb,
                                        const Tensor& doutput, const Tensor& dwte_slice,
                                        const Tensor& dwpe_whole) const {
  if (!dwte_slice.defined() && !dwpe_whole.defined()) return;
  const int64_t c = (dwte_slice.defined() ? dwte_slice : dwpe_whole).size(1);
  CheckTensor(doutput, ctx.dtype(), {mb.B(), mb.T(), c}, "embedding doutput");
  const kernels::VocabSlice slice =
      dwte_slice.defined() ? SliceOf(dwte_slice, tp_) : kernels::VocabSlice{};
  if (!mb.positions.defined()) {
    ctx.ops().EmbeddingBackward(doutput, mb.tokens, dwte_slice, dwpe_whole, slice);
    return;
  }
  ctx.ops().EmbeddingBackward(doutput, mb.tokens, dwte_slice, Tensor(), slice);
  nn::PositionRowsBackward(ctx, mb, doutput, dwpe_whole);
}

}  // namespace ztrain::tensor
