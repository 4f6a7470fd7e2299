#include "nn/transformer.h"

#include "core/error.h"

namespace ztrain::nn {
namespace {

Shape Rows(const Tensor& t) { return {t.size(0) * t.size(1), t.size(2)}; }

// Note [Sequence parallelism]: the whole [N, C] rows of this piece's `rows` [N/P, C] (an
// all-gather into workspace that `hold` keeps), or `rows` itself without sequence parallelism.
Tensor WholeRows(LayerContext& ctx, const LinearProvider& p, const Tensor& rows, Buffer& hold) {
  if (!p.sequence_parallel()) return rows;
  const Shape shape{rows.size(0) * p.size(), rows.size(1)};
  hold = Buffer(ctx.allocator(), rows.dtype(), shape, MemoryCategory::kWorkspace);
  const Tensor whole = hold.AsTensor(rows.dtype(), shape);
  p.GatherRows(ctx, rows, whole);
  return whole;
}

}  // namespace

// ---- Embedding -----------------------------------------------------------------------------

Embedding::Embedding(const EmbeddingSpec& spec, std::shared_ptr<const LinearProvider> provider)
    : provider_(std::move(provider)), spec_(spec) {
  wte_ = table_.Add(provider_->VocabRows(Weight(spec.tokens, {spec.padded_vocab, spec.channels})));
  if (!spec.positions.empty()) {
    wpe_ = table_.Add(Weight(spec.positions, {spec.max_seq_len, spec.channels}));
  }
}

Shape Embedding::OutputShape(const Shape& tokens_shape) const {
  ZTRAIN_CHECK(tokens_shape.size() == 2 && tokens_shape[1] <= spec_.max_seq_len,
               "sequence length ", tokens_shape.size() == 2 ? tokens_shape[1] : -1,
               " exceeds model.max_seq_len ", spec_.max_seq_len,
               "; lower data.seq_len or raise model.max_seq_len");
  // Note [Sequence parallelism]: this piece's share of the rows.
  const int64_t pieces = provider_->sequence_parallel() ? provider_->size() : 1;
  ZTRAIN_CHECK_T(ConfigError, tokens_shape[1] % pieces == 0, "data.seq_len ", tokens_shape[1],
                 " does not divide over tensor_parallel.size ", pieces,
                 " under sequence parallelism; use a multiple of ", pieces);
  return {tokens_shape[0], tokens_shape[1] / pieces, spec_.channels};
}

void Embedding::Forward(const MicroBatch& mb, const Tensor&, const Tensor& output,
                        LayerContext& ctx) {
  const ParamViews v = views();
  provider_->EmbeddingForward(ctx, mb, v.param(wte_), v.param(wpe_), output);
}

// Positions first .. first + T - 1: the position table's rows from `first` on.
void Embedding::Decode(const DecodeStep& step, const Tensor&, const Tensor& output,
                       LayerContext& ctx) {
  const ParamViews v = views();
  const int64_t t = step.tokens.size(1);
  ZTRAIN_CHECK(step.first_position + t <= spec_.max_seq_len, "position ",
               step.first_position + t - 1, " is beyond model.max_seq_len ", spec_.max_seq_len);
  const Tensor wpe = v.param(wpe_);
  ctx.ops().EmbeddingForward(
      step.tokens, v.param(wte_),
      wpe.defined() ? wpe.Slice(step.first_position, step.first_position + t) : Tensor(), output);
}

void Embedding::Backward(const MicroBatch& mb, const Tensor&, const Tensor& doutput,
                         const Tensor&, LayerContext& ctx) {
  const ParamViews v = views();
  provider_->EmbeddingBackward(ctx, mb, doutput, v.grad(wte_), v.grad(wpe_));
}

void Embedding::Adapt(const AdapterPlan& plan) {
  for (int i : {wte_, wpe_}) {
    if (i >= 0) table_.at(i).trainable = plan.Trains(table_.at(i).name, false, false);
  }
}

// ---- TransformerBlock ------------------------------------------------------------------------

TransformerBlock::TransformerBlock(const BlockSpec& spec,
                                   std::shared_ptr<const LinearProvider> provider)
    : provider_(std::move(provider)),
      name_(spec.prefix.substr(0, spec.prefix.size() - 1)),
      index_(spec.index),
      c_(spec.channels) {
  const std::string& p = spec.prefix;
  AttentionSpec attention = spec.attention;
  for (std::string* name : {&attention.qkv, &attention.q, &attention.k, &attention.v,
                            &attention.o}) {
    if (!name->empty()) *name = p + *name;
  }
  MlpSpec mlp = spec.mlp;
  for (std::string* name : {&mlp.gate, &mlp.up, &mlp.down}) {
    if (!name->empty()) *name = p + *name;
  }
  norm1_ = Norm(spec.norm, p + spec.norm1, c_, table_);
  attention_ = Attention(attention, c_, *provider_, table_);
  norm2_ = Norm(spec.norm, p + spec.norm2, c_, table_);
  mlp_ = Mlp(mlp, c_, *provider_, table_);
}

double TransformerBlock::ForwardFlopsPerToken(int64_t seq_len) const {
  return attention_.ForwardFlopsPerToken(seq_len) + mlp_.ForwardFlopsPerToken();
}

void TransformerBlock::Adapt(const AdapterPlan& plan) {
  norm1_.Adapt(plan, table_);
  attention_.Adapt(plan, index_, *provider_, table_);
  norm2_.Adapt(plan, table_);
  mlp_.Adapt(plan, index_, *provider_, table_);
}

void TransformerBlock::Forward(const MicroBatch& mb, const Tensor& input, const Tensor& output,
                               LayerContext& ctx) {
  const ParamViews v = views();
  const int64_t b = input.size(0), n = b * input.size(1);
  const Tensor x = input.View({n, c_});
  const Tensor ln1 = norm1_.Forward(ctx, v, "ln1", x);
  const Tensor res = ctx.Save("res", ctx.dtype(), {n, c_});
  {  // under sequence parallelism the linears read every piece's rows: gathered, then freed
    Buffer whole;
    attention_.Forward(ctx, *provider_, v, mb, WholeRows(ctx, *provider_, ln1, whole), x, res);
  }
  const Tensor ln2 = norm2_.Forward(ctx, v, "ln2", res);
  Buffer whole;
  mlp_.Forward(ctx, *provider_, v, WholeRows(ctx, *provider_, ln2, whole), res,
               output.View({n, c_}));
}

void TransformerBlock::Decode(const DecodeStep& step, const Tensor& input, const Tensor& output,
                              LayerContext& ctx) {
  const ParamViews v = views();
  const int64_t n = input.size(0) * input.size(1);
  const Tensor x = input.View({n, c_});
  const Tensor ln1 = norm1_.Forward(ctx, v, "ln1", x);
  const Tensor res = ctx.Scratch(DType::kF32, {n, c_});
  attention_.Decode(ctx, *provider_, v, step.caches->at(static_cast<size_t>(index_)),
                    step.first_position, step.capacity, *step.cache_allocator, ln1, x, res);
  const Tensor ln2 = norm2_.Forward(ctx, v, "ln2", res);
  mlp_.Forward(ctx, *provider_, v, ln2, res, output.View({n, c_}));
}

void TransformerBlock::Backward(const MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                                const Tensor& dinput, LayerContext& ctx) {
  kernels::Ops& ops = ctx.ops();
  const ParamViews v = views();
  const int64_t b = input.size(0), n = b * input.size(1);
  const Tensor dy = doutput.View({n, c_});
  // Under sequence parallelism the linears take every piece's rows of their output gradient
  // and input (gathered again rather than kept from forward), and give this piece's rows of
  // their input gradient (Note [Sequence parallelism]).
  const LinearProvider& p = *provider_;
  // MLP branch: y = res + mlp(ln2(res)).
  const Tensor dln2 = ctx.Scratch(ctx.dtype(), {n, c_});
  {
    Buffer whole_dy, whole_ln2;
    mlp_.Backward(ctx, p, v, WholeRows(ctx, p, dy, whole_dy),
                  WholeRows(ctx, p, ctx.Saved("ln2"), whole_ln2), dln2);
  }
  const Tensor dres = ctx.Scratch(ctx.dtype(), {n, c_});
  norm2_.Backward(ctx, v, "ln2", dln2, ctx.Saved("res"), dres, &p);
  ops.AddInPlace(dres, dy);
  // Attention branch: res = x + attention(ln1(x)).
  const Tensor dln1 = ctx.Scratch(ctx.dtype(), {n, c_});
  {
    Buffer whole_dres, whole_ln1;
    attention_.Backward(ctx, p, v, mb, WholeRows(ctx, p, dres, whole_dres),
                        WholeRows(ctx, p, ctx.Saved("ln1"), whole_ln1), dln1);
  }
  const Tensor dx = dinput.View({n, c_});
  norm1_.Backward(ctx, v, "ln1", dln1, input.View({n, c_}), dx, &p);
  ops.AddInPlace(dx, dres);
}

// ---- LmHead --------------------------------------------------------------------------------

LmHead::LmHead(const HeadSpec& spec, std::shared_ptr<const LinearProvider> provider)
    : provider_(std::move(provider)), spec_(spec) {
  ZTRAIN_CHECK(spec.vocab > 0 && spec.vocab <= spec.padded_vocab, "model.vocab_size ",
               spec.vocab, " must be in [1, model.padded_vocab_size = ", spec.padded_vocab, "]");
  norm_ = Norm(spec.norm, spec.norm_name, spec.channels, table_);
  // Tied: the same slice as the embedding's table, so the storage is shared piece by piece.
  ParamSpec w = provider_->VocabRows(Weight(spec.weight, {spec.padded_vocab, spec.channels}));
  w.tied_to = spec.tied_to;
  local_vocab_ = w.shape[0];
  weight_ = table_.Add(std::move(w));
}

// The losses of every token: under sequence parallelism the input holds this piece's rows.
Shape LmHead::OutputShape(const Shape& input_shape) const {
  const int64_t pieces = provider_->sequence_parallel() ? provider_->size() : 1;
  return {input_shape.at(0), input_shape.at(1) * pieces};
}

// A tied head's weight is the embedding's: it trains when the embedding does.
void LmHead::Adapt(const AdapterPlan& plan) {
  norm_.Adapt(plan, table_);
  ParamSpec& w = table_.at(weight_);
  w.trainable = plan.Trains(w.tied_to.empty() ? w.name : w.tied_to, false, false);
}

double LmHead::ForwardFlopsPerToken(int64_t) const {
  return 2.0 * static_cast<double>(spec_.channels) * static_cast<double>(local_vocab_);
}

void LmHead::Forward(const MicroBatch& mb, const Tensor& input, const Tensor& output,
                     LayerContext& ctx) {
  const ParamViews v = views();
  const Tensor lnf = norm_.Forward(ctx, v, "lnf", input.View(Rows(input)));
  Buffer whole;
  provider_->HeadLossForward(ctx, mb, WholeRows(ctx, *provider_, lnf, whole), v.param(weight_),
                             spec_.vocab, output.View({output.numel()}));
}

Shape LmHead::DecodeOutputShape(const Shape& input_shape) const {
  return {input_shape[0] * input_shape[1], spec_.padded_vocab};
}

void LmHead::Decode(const DecodeStep&, const Tensor& input, const Tensor& output,
                    LayerContext& ctx) {
  const ParamViews v = views();
  const Tensor lnf = norm_.Forward(ctx, v, "lnf", input.View(Rows(input)));
  ctx.ops().LinearForward(lnf, v.param(weight_), Tensor(), output);
}

void LmHead::Backward(const MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                      const Tensor& dinput, LayerContext& ctx) {
  const ParamViews v = views();
  const int64_t n = input.size(0) * input.size(1);  // this piece's rows
  const Tensor dlnf = ctx.Scratch(ctx.dtype(), {n, spec_.channels});
  {
    Buffer whole;
    provider_->HeadLossBackward(ctx, mb, WholeRows(ctx, *provider_, ctx.Saved("lnf"), whole),
                                v.param(weight_), spec_.vocab, doutput.View({doutput.numel()}),
                                dlnf, v.grad(weight_));
  }
  norm_.Backward(ctx, v, "lnf", dlnf, input.View(Rows(input)), dinput.View(Rows(input)),
                 provider_.get());
}

}  // namespace ztrain::nn
