// ParallelTransformerBlock: nn::TransformerBlock with c_attn/c_fc column-parallel and both
// c_proj row-parallel (Note [Megatron f and g] in tp_layers.h). The local q, k and v blocks of
// c_attn are this rank's heads, laid out as the attention op expects for n_head/P heads.
#include <cmath>

#include "core/error.h"
#include "nn/layer_context.h"
#include "parallel/tensor/tp_common.h"
#include "parallel/tensor/tp_layers.h"

namespace ztrain::tensor {

// Parameter order as nn::TransformerBlock: 0 ln_1.w, 1 ln_1.b, 2 c_attn.w, 3 c_attn.b,
// 4 attn.c_proj.w, 5 attn.c_proj.b, 6 ln_2.w, 7 ln_2.b, 8 c_fc.w, 9 c_fc.b, 10 mlp.c_proj.w,
// 11 mlp.c_proj.b.

ParallelTransformerBlock::ParallelTransformerBlock(int index, int n_layer, int64_t channels,
                                                   int n_head, comm::Communicator& tp)
    : tp_(tp),
      prefix_("h." + std::to_string(index) + "."),
      n_layer_(n_layer),
      c_(channels),
      nh_(n_head) {
  ZTRAIN_CHECK(n_head > 0 && channels % n_head == 0, "model.n_embd (", channels,
               ") must be divisible by model.n_head (", n_head, ")");
  detail::CheckDivides("model.n_head", n_head, tp.size(),
                       "the tp size must divide the number of attention heads");
  cl_ = c_ / tp.size();
  nhl_ = nh_ / tp.size();
}

std::vector<nn::ParamSpec> ParallelTransformerBlock::Params() const {
  using detail::Bias, detail::NormWeight, detail::Split, detail::Weight;
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(n_layer_));
  const std::string& p = prefix_;
  return {NormWeight(p + "ln_1.weight", c_), Bias(p + "ln_1.bias", c_),
          // Column-parallel over q, k and v at once: each of the 3 blocks gives its rows.
          Split(Weight(p + "attn.c_attn.weight", {3 * c_, c_}), 0, 3, tp_),
          Split(Bias(p + "attn.c_attn.bias", 3 * c_), 0, 3, tp_),
          Split(Weight(p + "attn.c_proj.weight", {c_, c_}, proj_std), 1, 1, tp_),
          Bias(p + "attn.c_proj.bias", c_), NormWeight(p + "ln_2.weight", c_),
          Bias(p + "ln_2.bias", c_), Split(Weight(p + "mlp.c_fc.weight", {4 * c_, c_}), 0, 1, tp_),
          Split(Bias(p + "mlp.c_fc.bias", 4 * c_), 0, 1, tp_),
          Split(Weight(p + "mlp.c_proj.weight", {c_, 4 * c_}, proj_std), 1, 1, tp_),
          Bias(p + "mlp.c_proj.bias", c_)};
}

double ParallelTransformerBlock::ForwardFlopsPerToken(int64_t seq_len) const {
  const double c = static_cast<double>(c_);
  // nn::TransformerBlock's count (four matmuls plus causal attention over on average T/2
  // keys); all of it is split, so each rank does 1/P.
  const double whole = 2.0 * 12.0 * c * c + 2.0 * 2.0 * c * static_cast<double>(seq_len) / 2.0;
  return whole / tp_.size();
}

void ParallelTransformerBlock::Forward(const nn::MicroBatch&, const Tensor& input,
                                       const Tensor& output, nn::LayerContext& ctx) {
  detail::CheckHostOps(ctx, Name());
  kernels::Ops& ops = ctx.ops();
  const int64_t b = input.size(0), t = input.size(1), n = b * t, c = c_, cl = cl_;
  const Tensor x = input.View({n, c});
  const Tensor y = output.View({n, c});
  // Attention: ln1 whole -> (f) -> c_attn column-parallel -> this rank's heads ->
  // c_proj row-parallel -> (g) all-reduce -> + bias + x.
  const DType d = ctx.dtype();
  // Both row-parallel partial sums, in fp32 (Note [Tensor parallelism in 16 bits]): y
  // itself in fp32 (the attention's sum passes through it before the MLP's lands there).
  Buffer hold;
  const Tensor sum = detail::Fp32Partial(ctx, y, hold);
  const Tensor ln1 = detail::SavedLayerNorm(ctx, "ln1", x, param(0), param(1));
  const Tensor qkv = ctx.Save("qkv", d, {n, 3 * cl});
  ops.LinearForward(ln1, param(2), param(3), qkv);
  const Tensor att = ctx.Save("att", d, {n, cl});
  const Tensor lse = ctx.Save("lse", DType::kF32, {b, nhl_, t});
  ops.AttentionForward(qkv.View({b, t, 3 * cl}), nhl_, att.View({b, t, cl}), lse);
  const Tensor res = ctx.Save("res", d, {n, c});
  ops.LinearForward(att, param(4), Tensor(), sum);
  tp_.AllReduce(sum)->Wait();
  detail::AddBiasAndResidual(sum, param(5), x, res);
  // MLP: ln2 whole -> (f) -> c_fc column-parallel -> GELU on this rank's features ->
  // c_proj row-parallel -> (g) all-reduce -> + bias + res.
  const Tensor ln2 = detail::SavedLayerNorm(ctx, "ln2", res, param(6), param(7));
  const Tensor fch = ctx.Save("fch", d, {n, 4 * cl});
  ops.LinearForward(ln2, param(8), param(9), fch);
  const Tensor fch_gelu = ctx.Save("fch_gelu", d, {n, 4 * cl});
  ops.GeluForward(fch, fch_gelu);
  ops.LinearForward(fch_gelu, param(10), Tensor(), sum);
  tp_.AllReduce(sum)->Wait();
  detail::AddBiasAndResidual(sum, param(11), res, y);
}

void ParallelTransformerBlock::Backward(const nn::MicroBatch&, const Tensor& input,
                                        const Tensor& doutput, const Tensor& dinput,
                                        nn::LayerContext& ctx) {
  detail::CheckHostOps(ctx, Name());
  kernels::Ops& ops = ctx.ops();
  const int64_t b = input.size(0), t = input.size(1), n = b * t, c = c_, cl = cl_;
  const Tensor dy = doutput.View({n, c});
  // MLP branch. g's backward is the identity: dy (whole, replicated) feeds the row-parallel
  // c_proj directly, and its bias gradient comes out equal on every rank.
  const Tensor dfch_gelu = ctx.Scratch(ctx.dtype(), {n, 4 * cl});
  ops.LinearBackward(dy, ctx.Saved("fch_gelu"), param(10), dfch_gelu, grad(10), grad(11));
  const Tensor dfch = ctx.Scratch(ctx.dtype(), {n, 4 * cl});
  ops.GeluBackward(dfch_gelu, ctx.Saved("fch"), dfch);
  // f's backward: each rank's c_fc input gradient is a partial sum over its features.
  const Tensor dln2 = ctx.Scratch(ctx.dtype(), {n, c});
  detail::LinearBackwardAllReduceDx(ctx, tp_, dfch, ctx.Saved("ln2"), param(8), dln2, grad(8),
                                    grad(9));
  const Tensor dres = ctx.Scratch(ctx.dtype(), {n, c});
  detail::SavedLayerNormBackward(ctx, "ln2", dln2, ctx.Saved("res"), param(6), dres, grad(6),
                                 grad(7));
  ops.AddInPlace(dres, dy);
  // Attention branch, the same pattern.
  const Tensor datt = ctx.Scratch(ctx.dtype(), {n, cl});
  ops.LinearBackward(dres, ctx.Saved("att"), param(4), datt, grad(4), grad(5));
  const Tensor dqkv = ctx.Scratch(ctx.dtype(), {n, 3 * cl});
  ops.AttentionBackward(datt.View({b, t, cl}), ctx.Saved("qkv").View({b, t, 3 * cl}),
                        ctx.Saved("att").View({b, t, cl}), ctx.Saved("lse"), nhl_,
                        dqkv.View({b, t, 3 * cl}));
  const Tensor dln1 = ctx.Scratch(ctx.dtype(), {n, c});
  detail::LinearBackwardAllReduceDx(ctx, tp_, dqkv, ctx.Saved("ln1"), param(2), dln1, grad(2),
                                    grad(3));
  const Tensor dx = dinput.View({n, c});
  detail::SavedLayerNormBackward(ctx, "ln1", dln1, input.View({n, c}), param(0), dx, grad(0),
                                 grad(1));
  ops.AddInPlace(dx, dres);
}

}  // namespace ztrain::tensor
