// MegatronLinears' LM head: this rank's slice of the logits and the vocabulary-parallel
// cross-entropy (Megatron's), which never gathers the logits.
//
// For a row with logits z over the whole real vocabulary and target y:
//   loss = log(sum_j exp(z_j - m)) + m - z_y,   m = max_j z_j,
// and each of m, sum_j exp(z_j - m) and z_y splits over the vocabulary slices: m is the max
// of the slices' maxima (all-reduce kMax), and then the sum of exp and z_y are sums of the
// slices' parts (one all-reduce of both). The gradient
//   dz_j = (exp(z_j - m) / sum - [j == y]) * dloss
// needs only the row's m and sum, which forward saves, so backward issues no collective for
// it: only the all-reduce of the layernorm output's gradient (Megatron's f; the LM head is
// column-parallel over the vocabulary). Padded columns (>= vocab_size) take no part and get
// zero gradient, as in the single-process kernel.
#include "core/error.h"
#include "nn/layer_context.h"
#include "parallel/tensor/megatron_linears.h"

namespace ztrain::tensor {
namespace {

// This rank's columns of the padded vocabulary: ids [rank * local, (rank + 1) * local) of
// which those below the real vocabulary take part (Ops::VocabParallelCrossEntropy).
kernels::VocabSlice SliceOf(const Tensor& weight, int64_t vocab, const comm::Communicator& tp) {
  return {weight.size(0) * tp.rank(), vocab};
}

}  // namespace

void MegatronLinears::HeadLossForward(nn::LayerContext& ctx, const nn::MicroBatch& mb,
                                      const Tensor& h, const Tensor& weight, int64_t vocab,
                                      const Tensor& output) const {
  const kernels::VocabSlice slice = SliceOf(weight, vocab, tp_);
  const int64_t n = h.size(0);
  CheckTensor(output, DType::kF32, {n}, "lm_head output");
  kernels::Ops& ops = ctx.ops();
  // The logits are the compute dtype, as the whole head's; the statistics are fp32 (of the
  // rounded logits, as the single-process softmax's).
  const Tensor logits = ctx.Save("logits", ctx.dtype(), {n, weight.size(0)});
  ops.LinearForward(h, weight, Tensor(), logits);
  const Tensor stats = ctx.Save("ce_stats", DType::kF32, {3, n});
  // The max checks every target first, before either collective: the ranks see the same
  // targets, so they all throw together and none is left waiting. A rank whose slice is all
  // padding contributes -inf to the max and 0 to the sums.
  ops.VocabParallelCrossEntropy(kernels::CrossEntropyStep::kMax, logits, mb.targets, slice, stats,
                                output);
  tp_.AllReduce(stats.Flat(0, {n}), comm::ReduceOp::kMax)->Wait();
  ops.VocabParallelCrossEntropy(kernels::CrossEntropyStep::kSumExp, logits, mb.targets, slice,
                                stats, output);
  tp_.AllReduce(stats.Flat(n, {2 * n}))->Wait();
  ops.VocabParallelCrossEntropy(kernels::CrossEntropyStep::kLoss, logits, mb.targets, slice,
                                stats, output);
}

void MegatronLinears::HeadLossBackward(nn::LayerContext& ctx, const nn::MicroBatch& mb,
                                       const Tensor& h, const Tensor& weight, int64_t vocab,
                                       const Tensor& doutput, const Tensor& dh,
                                       const Tensor& dweight) const {
  CheckTensor(doutput, DType::kF32, {h.size(0)}, "lm_head doutput");
  // The saved logits become dlogits in place (as nn::LmHead does): no second [N, Vp/P].
  const Tensor logits = ctx.Saved("logits");
  ctx.ops().VocabParallelCrossEntropyBackward(logits, mb.targets, SliceOf(weight, vocab, tp_),
                                              ctx.Saved("ce_stats"), doutput);
  // dh = dlogits @ W_local is this rank's partial sum over its vocabulary slice (the head is
  // column-parallel over the vocabulary: Megatron's f).
  const nn::LinearGrad g{logits, weight, dweight, Tensor(), Buffer()};
  ColumnBackward(ctx, std::span<const nn::LinearGrad>(&g, 1), h, dh);
}

}  // namespace ztrain::tensor
