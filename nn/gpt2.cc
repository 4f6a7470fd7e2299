#include "nn/gpt2.h"

#include <cmath>

#include "nn/gpt2_parts.h"

namespace ztrain::nn {
namespace {

Shape Rows(const Tensor& t) { return {t.size(0) * t.size(1), t.size(2)}; }

}  // namespace

// ---- Embedding ---------------------------------------------------------------------------

Embedding::Embedding(int64_t padded_vocab, int64_t max_seq_len, int64_t channels)
    : vp_(padded_vocab), max_t_(max_seq_len), c_(channels) {}

std::vector<ParamSpec> Embedding::Params() const {
  return {Weight("wte", {vp_, c_}), Weight("wpe", {max_t_, c_})};
}

Shape Embedding::OutputShape(const Shape& tokens_shape) const {
  ZTRAIN_CHECK(tokens_shape.size() == 2 && tokens_shape[1] <= max_t_, "sequence length ",
               tokens_shape.size() == 2 ? tokens_shape[1] : -1, " exceeds model.max_seq_len ",
               max_t_, "; lower data.seq_len or raise model.max_seq_len");
  return {tokens_shape[0], tokens_shape[1], c_};
}

void Embedding::Forward(const MicroBatch& mb, const Tensor&, const Tensor& output,
                        LayerContext& ctx) {
  ctx.ops().EmbeddingForward(mb.tokens, param(0), param(1), output);
}

void Embedding::Backward(const MicroBatch& mb, const Tensor&, const Tensor& doutput,
                         const Tensor&, LayerContext& ctx) {
  ctx.ops().EmbeddingBackward(doutput, mb.tokens, grad(0), grad(1));
}

// ---- TransformerBlock ----------------------------------------------------------------------
// Parameter order: 0 ln_1.w, 1 ln_1.b, 2 c_attn.w, 3 c_attn.b, 4 attn.c_proj.w, 5 attn.c_proj.b,
// 6 ln_2.w, 7 ln_2.b, 8 c_fc.w, 9 c_fc.b, 10 mlp.c_proj.w, 11 mlp.c_proj.b.

TransformerBlock::TransformerBlock(int index, int n_layer, int64_t channels, int n_head)
    : prefix_("h." + std::to_string(index) + "."), n_layer_(n_layer), c_(channels), nh_(n_head) {
  ZTRAIN_CHECK(n_head > 0 && channels % n_head == 0, "model.n_embd (", channels,
               ") must be divisible by model.n_head (", n_head, ")");
}

std::vector<ParamSpec> TransformerBlock::Params() const {
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(n_layer_));
  const std::string& p = prefix_;
  return {NormWeight(p + "ln_1.weight", c_),
          Bias(p + "ln_1.bias", c_),
          Weight(p + "attn.c_attn.weight", {3 * c_, c_}),
          Bias(p + "attn.c_attn.bias", 3 * c_),
          Weight(p + "attn.c_proj.weight", {c_, c_}, proj_std),
          Bias(p + "attn.c_proj.bias", c_),
          NormWeight(p + "ln_2.weight", c_),
          Bias(p + "ln_2.bias", c_),
          Weight(p + "mlp.c_fc.weight", {4 * c_, c_}),
          Bias(p + "mlp.c_fc.bias", 4 * c_),
          Weight(p + "mlp.c_proj.weight", {c_, 4 * c_}, proj_std),
          Bias(p + "mlp.c_proj.bias", c_)};
}

double TransformerBlock::ForwardFlopsPerToken(int64_t seq_len) const {
  const double c = static_cast<double>(c_);
  // Four matmuls (3C + C + 4C + 4C outputs of C inputs) plus causal attention: q.k and p.v
  // over on average T/2 keys.
  return 2.0 * 12.0 * c * c + 2.0 * 2.0 * c * static_cast<double>(seq_len) / 2.0;
}

void TransformerBlock::Forward(const MicroBatch&, const Tensor& input, const Tensor& output,
                               LayerContext& ctx) {
  kernels::Ops& ops = ctx.ops();
  const int64_t b = input.size(0), t = input.size(1), n = b * t, c = c_;
  const Tensor x = input.View({n, c});
  const Tensor y = output.View({n, c});
  const Tensor ln1 = SavedLayerNorm(ctx, "ln1", x, param(0), param(1));
  const Tensor qkv = ctx.Save("qkv", ctx.dtype(), {n, 3 * c});
  ops.LinearForward(ln1, param(2), param(3), qkv);
  const Tensor att = ctx.Save("att", ctx.dtype(), {n, c});
  const Tensor lse = ctx.Save("lse", DType::kF32, {b, nh_, t});
  ops.AttentionForward(qkv.View({b, t, 3 * c}), nh_, att.View({b, t, c}), lse);
  const Tensor res = ctx.Save("res", ctx.dtype(), {n, c});
  ops.LinearForward(att, param(4), param(5), res);
  ops.AddInPlace(res, x);
  const Tensor ln2 = SavedLayerNorm(ctx, "ln2", res, param(6), param(7));
  const Tensor fch = ctx.Save("fch", ctx.dtype(), {n, 4 * c});
  ops.LinearForward(ln2, param(8), param(9), fch);
  const Tensor fch_gelu = ctx.Save("fch_gelu", ctx.dtype(), {n, 4 * c});
  ops.GeluForward(fch, fch_gelu);
  ops.LinearForward(fch_gelu, param(10), param(11), y);
  ops.AddInPlace(y, res);
}

void TransformerBlock::Backward(const MicroBatch&, const Tensor& input, const Tensor& doutput,
                                const Tensor& dinput, LayerContext& ctx) {
  kernels::Ops& ops = ctx.ops();
  const int64_t b = input.size(0), t = input.size(1), n = b * t, c = c_;
  const Tensor dy = doutput.View({n, c});
  // MLP branch: y = res + c_proj(gelu(c_fc(ln2(res)))).
  const Tensor dfch_gelu = ctx.Scratch(ctx.dtype(), {n, 4 * c});
  ops.LinearBackward(dy, ctx.Saved("fch_gelu"), param(10), dfch_gelu, grad(10), grad(11));
  const Tensor dfch = ctx.Scratch(ctx.dtype(), {n, 4 * c});
  ops.GeluBackward(dfch_gelu, ctx.Saved("fch"), dfch);
  const Tensor dln2 = ctx.Scratch(ctx.dtype(), {n, c});
  ops.LinearBackward(dfch, ctx.Saved("ln2"), param(8), dln2, grad(8), grad(9));
  const Tensor dres = ctx.Scratch(ctx.dtype(), {n, c});
  SavedLayerNormBackward(ctx, "ln2", dln2, ctx.Saved("res"), param(6), dres, grad(6), grad(7));
  ops.AddInPlace(dres, dy);
  // Attention branch: res = x + c_proj(attention(c_attn(ln1(x)))).
  const Tensor datt = ctx.Scratch(ctx.dtype(), {n, c});
  ops.LinearBackward(dres, ctx.Saved("att"), param(4), datt, grad(4), grad(5));
  const Tensor dqkv = ctx.Scratch(ctx.dtype(), {n, 3 * c});
  ops.AttentionBackward(datt.View({b, t, c}), ctx.Saved("qkv").View({b, t, 3 * c}),
                        ctx.Saved("att").View({b, t, c}), ctx.Saved("lse"), nh_,
                        dqkv.View({b, t, 3 * c}));
  const Tensor dln1 = ctx.Scratch(ctx.dtype(), {n, c});
  ops.LinearBackward(dqkv, ctx.Saved("ln1"), param(2), dln1, grad(2), grad(3));
  const Tensor dx = dinput.View({n, c});
  SavedLayerNormBackward(ctx, "ln1", dln1, input.View({n, c}), param(0), dx, grad(0), grad(1));
  ops.AddInPlace(dx, dres);
}

// ---- LmHead ------------------------------------------------------------------------------------
// Parameter order: 0 ln_f.weight, 1 ln_f.bias, 2 wte (tied to the embedding's).

LmHead::LmHead(int64_t vocab, int64_t padded_vocab, int64_t channels)
    : v_(vocab), vp_(padded_vocab), c_(channels) {}

std::vector<ParamSpec> LmHead::Params() const {
  ParamSpec wte = Weight("lm_head.weight", {vp_, c_});
  wte.tied_to = "wte";
  return {NormWeight("ln_f.weight", c_), Bias("ln_f.bias", c_), wte};
}

Shape LmHead::OutputShape(const Shape& input_shape) const {
  return {input_shape.at(0), input_shape.at(1)};
}

double LmHead::ForwardFlopsPerToken(int64_t) const {
  return 2.0 * static_cast<double>(c_) * static_cast<double>(vp_);
}

void LmHead::Forward(const MicroBatch& mb, const Tensor& input, const Tensor& output,
                     LayerContext& ctx) {
  kernels::Ops& ops = ctx.ops();
  const int64_t n = input.size(0) * input.size(1);
  const Tensor lnf = SavedLayerNorm(ctx, "lnf", input.View(Rows(input)), param(0), param(1));
  const Tensor logits = ctx.Save("logits", ctx.dtype(), {n, vp_});
  ops.LinearForward(lnf, param(2), Tensor(), logits);
  ops.SoftmaxCrossEntropy(logits, mb.targets.View({n}), v_, output.View({n}), Tensor());
}

void LmHead::Backward(const MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                      const Tensor& dinput, LayerContext& ctx) {
  kernels::Ops& ops = ctx.ops();
  const int64_t n = input.size(0) * input.size(1);
  // Recomputes the softmax and turns the saved logits into dlogits in place.
  const Tensor logits = ctx.Saved("logits");
  const Tensor losses = ctx.Scratch(DType::kF32, {n});
  ops.SoftmaxCrossEntropy(logits, mb.targets.View({n}), v_, losses, doutput.View({n}));
  const Tensor dlnf = ctx.Scratch(ctx.dtype(), {n, c_});
  ops.LinearBackward(logits, ctx.Saved("lnf"), param(2), dlnf, grad(2), Tensor());
  SavedLayerNormBackward(ctx, "lnf", dlnf, input.View(Rows(input)), param(0),
                         dinput.View(Rows(input)), grad(0), grad(1));
}

std::vector<std::unique_ptr<Layer>> BuildGpt2(const ModelConfig& m) {
  ZTRAIN_CHECK(m.type == "gpt2", "model.type '", m.type, "' is not known; use \"gpt2\"");
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<Embedding>(m.padded_vocab_size, m.max_seq_len, m.n_embd));
  for (int l = 0; l < m.n_layer; ++l)
    layers.push_back(std::make_unique<TransformerBlock>(l, m.n_layer, m.n_embd, m.n_head));
  layers.push_back(std::make_unique<LmHead>(m.vocab_size, m.padded_vocab_size, m.n_embd));
  return layers;
}

}  // namespace ztrain::nn
