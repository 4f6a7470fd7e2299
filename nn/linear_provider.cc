#include "nn/linear_provider.h"

#include "core/error.h"

namespace ztrain::nn {
namespace {

// `spec` cut into `parts` pieces along `dim`, `groups` blocks each; this piece is `part`.
ParamSpec Split(ParamSpec spec, int dim, int groups, int parts, int part) {
  if (parts == 1) return spec;
  int64_t& d = spec.shape.at(static_cast<size_t>(dim));
  ZTRAIN_ASSERT(d % (int64_t{groups} * parts) == 0, spec.name, " dimension ", dim, " of ",
                ShapeToString(spec.shape), " does not split into ", groups, " x ", parts);
  spec.tp.full_shape = spec.shape;
  spec.tp.dim = dim;
  spec.tp.groups = groups;
  spec.tp.parts = parts;
  spec.tp.part = part;
  d /= parts;
  return spec;
}

}  // namespace

ParamSpec LinearProvider::Column(ParamSpec whole, int groups) const {
  return Split(std::move(whole), 0, groups, size(), rank());
}

ParamSpec LinearProvider::Row(ParamSpec whole) const {
  return Split(std::move(whole), 1, 1, size(), rank());
}

// Here and below, an undefined (frozen) parameter gradient goes to the op, which skips it
// (Note [Frozen parameters] in kernels/ops.h).
void LinearProvider::GatherRows(LayerContext&, const Tensor&, const Tensor&) const {
  ZTRAIN_ASSERT(false, "GatherRows on a provider without sequence parallelism");
}

void WholeLinears::ColumnBackward(LayerContext& ctx, std::span<const LinearGrad> linears,
                                  const Tensor& x, const Tensor& dx) const {
  kernels::Ops& ops = ctx.ops();
  ZTRAIN_ASSERT(!linears.empty());
  const LinearGrad& first = linears[0];
  ops.LinearBackward(first.dy, x, first.weight, dx, first.dweight, first.dbias);
  for (const LinearGrad& l : linears.subspan(1)) {
    ops.Gemm(false, false, 1.0f, l.dy, l.weight, 1.0f, dx);  // dx += dy @ weight
    ops.LinearBackward(l.dy, x, l.weight, Tensor(), l.dweight, l.dbias);
  }
}

void WholeLinears::RowForward(LayerContext& ctx, const Tensor& x, const Tensor& weight,
                              const Tensor& bias, const Tensor& residual, const Tensor& y) const {
  ctx.ops().LinearForward(x, weight, bias, y);
  ctx.ops().AddInPlace(y, residual);
}

Tensor PositionRows(LayerContext& ctx, const MicroBatch& mb, const Tensor& wpe) {
  const Tensor rows = ctx.Scratch(DType::kF32, {mb.B(), mb.T(), wpe.size(1)});
  ctx.ops().EmbeddingForward(mb.positions, wpe, Tensor(), rows);
  return rows;
}

void PositionRowsBackward(LayerContext& ctx, const MicroBatch& mb, const Tensor& dout,
                          const Tensor& dwpe) {
  if (dwpe.defined()) ctx.ops().EmbeddingBackward(dout, mb.positions, dwpe, Tensor());
}

void WholeLinears::EmbeddingForward(LayerContext& ctx, const MicroBatch& mb, const Tensor& wte,
                                    const Tensor& wpe, const Tensor& out) const {
  if (!wpe.defined() || !mb.positions.defined()) {
    ctx.ops().EmbeddingForward(mb.tokens, wte, wpe, out);
    return;
  }
  // Packed documents: the token rows and the position rows in fp32, summed and rounded once,
  // as the op does with positions 0 .. T-1.
  const Tensor tokens = ctx.Scratch(DType::kF32, out.shape());
  ctx.ops().EmbeddingForward(mb.tokens, wte, Tensor(), tokens);
  ctx.ops().AddBiasAndResidual(tokens, Tensor(), PositionRows(ctx, mb, wpe), out);
}

void WholeLinears::EmbeddingBackward(LayerContext& ctx, const MicroBatch& mb, const Tensor& dout,
                                     const Tensor& dwte, const Tensor& dwpe) const {
  if (!mb.positions.defined()) {
    ctx.ops().EmbeddingBackward(dout, mb.tokens, dwte, dwpe);
    return;
  }
  ctx.ops().EmbeddingBackward(dout, mb.tokens, dwte, Tensor());
  PositionRowsBackward(ctx, mb, dout, dwpe);
}

void WholeLinears::HeadLossForward(LayerContext& ctx, const MicroBatch& mb, const Tensor& h,
                                   const Tensor& weight, int64_t vocab,
                                   const Tensor& losses) const {
  const int64_t n = h.size(0);
  const Tensor logits = ctx.Save("logits", ctx.dtype(), {n, weight.size(0)});
  ctx.ops().LinearForward(h, weight, Tensor(), logits);
  ctx.ops().SoftmaxCrossEntropy(logits, mb.targets.View({n}), vocab, losses, Tensor());
}

void WholeLinears::HeadLossBackward(LayerContext& ctx, const MicroBatch& mb, const Tensor& h,
                                    const Tensor& weight, int64_t vocab, const Tensor& dlosses,
                                    const Tensor& dh, const Tensor& dweight) const {
  kernels::Ops& ops = ctx.ops();
  const int64_t n = h.size(0);
  // Recomputes the softmax and turns the saved logits into dlogits in place.
  const Tensor logits = ctx.Saved("logits");
  const Tensor losses = ctx.Scratch(DType::kF32, {n});
  ops.SoftmaxCrossEntropy(logits, mb.targets.View({n}), vocab, losses, dlosses);
  ops.LinearBackward(logits, h, weight, dh, dweight, Tensor());
}

std::shared_ptr<const LinearProvider> MakeWholeLinears(
    std::shared_ptr<const ContextGroup> context) {
  return std::make_shared<const WholeLinears>(std::move(context));
}

}  // namespace ztrain::nn
