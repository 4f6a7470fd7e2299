// MegatronLinears' vocabulary-parallel embedding: each rank looks up the tokens of its
// vocabulary slice, writes zero rows for the others, and one all-reduce assembles the whole
// token embedding. Exactly one rank contributes each row and the others add +0, so the sum is
// bit-exact. The lookups are the ops' (EmbeddingForward/Backward over a VocabSlice), so the
// layer runs on either backend.
#include <vector>

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

// Note [Sequence parallelism]: the looked-up rows are reduce-scattered, so each rank sums only
// its own rows, then adds their position rows: each row's position in its sample (t of row
// b T + t), or its packed-document position.
void MegatronLinears::SequenceParallelEmbedding(nn::LayerContext& ctx, const nn::MicroBatch& mb,
                                                const Tensor& wte, const Tensor& wpe,
                                                const Tensor& output) const {
  const int64_t seq = mb.T(), c = wte.size(1), p = tp_.size();
  const int64_t rows = mb.B() * seq / p, first = rows * tp_.rank();
  CheckTensor(output, ctx.dtype(), {mb.B(), seq / p, c}, "embedding output");
  kernels::Ops& ops = ctx.ops();
  Buffer whole(ctx.allocator(), DType::kF32, {mb.B(), seq, c}, MemoryCategory::kWorkspace);
  const Tensor looked_up = whole.AsTensor(DType::kF32, {mb.B(), seq, c});
  ops.EmbeddingForward(mb.tokens, wte, Tensor(), looked_up, SliceOf(wte, tp_));
  Buffer hold;
  const Tensor sum = detail::Fp32Partial(ctx, output, hold);
  tp_.ReduceScatter(looked_up, sum)->Wait();
  whole.Reset();
  if (!wpe.defined()) {
    ops.AddBiasAndResidual(sum, Tensor(), Tensor(), output);
    return;
  }
  Tensor positions;
  std::vector<int32_t> host;
  if (mb.positions.defined()) {
    positions = mb.positions.Flat(first, {1, rows});
  } else {
    host.resize(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i)
      host[static_cast<size_t>(i)] = static_cast<int32_t>((first + i) % seq);
    positions = ctx.Scratch(DType::kI32, {1, rows});
    ops.Copy(Tensor(host.data(), DType::kI32, {1, rows}), positions);
  }
  Buffer position_rows(ctx.allocator(), DType::kF32, {1, rows, c}, MemoryCategory::kWorkspace);
  const Tensor added = position_rows.AsTensor(DType::kF32, {1, rows, c});
  ops.EmbeddingForward(positions, wpe, Tensor(), added);
  ops.AddBiasAndResidual(sum, Tensor(), added.View(sum.shape()), output);
  ops.Synchronize();  // before `host` and the workspace go
}

void MegatronLinears::EmbeddingForward(nn::LayerContext& ctx, const nn::MicroBatch& mb,
                                       const Tensor& wte, const Tensor& wpe,
                                       const Tensor& output) const {
  if (sequence_parallel_) return SequenceParallelEmbedding(ctx, mb, wte, wpe, output);
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
  const int64_t pieces = sequence_parallel_ ? tp_.size() : 1;
  CheckTensor(doutput, ctx.dtype(), {mb.B(), mb.T() / pieces, c}, "embedding doutput");
  Tensor whole = doutput;
  if (sequence_parallel_) {  // the whole gradient from every rank's rows, then as without
    whole = ctx.Scratch(ctx.dtype(), {mb.B(), mb.T(), c});
    GatherRows(ctx, doutput, whole);
  }
  const kernels::VocabSlice slice =
      dwte_slice.defined() ? SliceOf(dwte_slice, tp_) : kernels::VocabSlice{};
  if (!mb.positions.defined()) {
    ctx.ops().EmbeddingBackward(whole, mb.tokens, dwte_slice, dwpe_whole, slice);
    return;
  }
  ctx.ops().EmbeddingBackward(whole, mb.tokens, dwte_slice, Tensor(), slice);
  nn::PositionRowsBackward(ctx, mb, whole, dwpe_whole);
}

}  // namespace ztrain::tensor
