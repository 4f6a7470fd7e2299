#include "nn/modules.h"

#include <algorithm>
#include <cmath>

#include "core/buffer.h"
#include "core/error.h"

namespace ztrain::nn {
namespace {

ParamSpec Spec(std::string name, Shape shape, Init init, float std) {
  ParamSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.init = init;
  s.init_std = std;
  return s;
}

}  // namespace

int ParamTable::Add(ParamSpec spec) {
  specs_.push_back(std::move(spec));
  return static_cast<int>(specs_.size()) - 1;
}

ParamSpec Weight(std::string name, Shape shape, float std) {
  return Spec(std::move(name), std::move(shape), Init::kNormal, std);
}

ParamSpec Bias(std::string name, int64_t n) {
  return Spec(std::move(name), {n}, Init::kZeros, 0.0f);
}

ParamSpec NormWeight(std::string name, int64_t n) {
  return Spec(std::move(name), {n}, Init::kOnes, 0.0f);
}

// ---- Norm ----------------------------------------------------------------------------------

Norm::Norm(const NormSpec& spec, const std::string& name, int64_t channels, ParamTable& table)
    : spec_(spec) {
  ZTRAIN_CHECK(spec.kind == NormKind::kRmsNorm || spec.eps == 1e-5f, name,
               ": LayerNorm computes with eps 1e-5, not ", spec.eps);
  weight_ = table.Add(NormWeight(name + ".weight", channels));
  if (spec.kind == NormKind::kLayerNorm) bias_ = table.Add(Bias(name + ".bias", channels));
}

Tensor Norm::Forward(LayerContext& ctx, const ParamViews& v, const std::string& key,
                     const Tensor& x) const {
  const int64_t n = x.size(0);
  const Tensor y = ctx.Save(key, ctx.dtype(), x.shape());
  if (spec_.kind == NormKind::kLayerNorm) {
    ctx.ops().LayerNormForward(x, v.param(weight_), v.param(bias_), y,
                               ctx.Save(key + ".mean", DType::kF32, {n}),
                               ctx.Save(key + ".rstd", DType::kF32, {n}));
  } else {
    ctx.ops().RmsNormForward(x, v.param(weight_), spec_.eps, y,
                             ctx.Save(key + ".rstd", DType::kF32, {n}));
  }
  return y;
}

void Norm::Backward(LayerContext& ctx, const ParamViews& v, const std::string& key,
                    const Tensor& dy, const Tensor& x, const Tensor& dx,
                    const LinearProvider* rows_of) const {
  kernels::Ops& ops = ctx.ops();
  const Tensor dweight = v.grad(weight_);
  const Tensor dbias = bias_ >= 0 ? v.grad(bias_) : Tensor();
  // Under sequence parallelism this piece's rows give part of the gradients: into fp32
  // workspace (weight, then bias), summed over the pieces, then accumulated.
  const bool partial =
      rows_of != nullptr && rows_of->sequence_parallel() && (dweight.defined() || dbias.defined());
  Tensor parts, pw = dweight, pb = dbias;
  if (partial) {
    const int64_t c = x.size(-1);
    parts = ctx.Scratch(DType::kF32, {2, c});
    ops.Zero(parts);
    pw = dweight.defined() ? parts.Flat(0, {c}) : Tensor();
    pb = dbias.defined() ? parts.Flat(c, {c}) : Tensor();
  }
  if (spec_.kind == NormKind::kLayerNorm) {
    ops.LayerNormBackward(dy, x, v.param(weight_), ctx.Saved(key + ".mean"),
                          ctx.Saved(key + ".rstd"), dx, pw, pb);
  } else {
    ops.RmsNormBackward(dy, x, v.param(weight_), ctx.Saved(key + ".rstd"), dx, pw);
  }
  if (!partial) return;
  rows_of->SumOverPieces(ctx, parts);
  if (dweight.defined()) ops.AddInPlace(dweight, pw);
  if (dbias.defined()) ops.AddInPlace(dbias, pb);
}

void Norm::Adapt(const AdapterPlan& plan, ParamTable& table) const {
  table.at(weight_).trainable = plan.Trains(table.at(weight_).name, false, false);
  if (bias_ >= 0) table.at(bias_).trainable = plan.Trains(table.at(bias_).name, true, false);
}

// ---- Linear --------------------------------------------------------------------------------

Linear::Linear(std::vector<LinearSpec> specs, LinearSplit split, const LinearProvider& provider,
               ParamTable& table, int groups)
    : specs_(specs), split_(split), groups_(groups) {
  ZTRAIN_ASSERT(!specs.empty() && (specs.size() == 1 || split == LinearSplit::kColumn));
  local_in_ = split == LinearSplit::kRow ? specs[0].in / provider.size() : specs[0].in;
  for (size_t i = 0; i < specs.size(); ++i) {
    const LinearSpec& s = specs[i];
    ZTRAIN_ASSERT(s.in == specs[0].in && s.bias == specs[0].bias);
    ParamSpec w = Weight(s.name + ".weight", {s.out, s.in}, s.std);
    w = split == LinearSplit::kColumn ? provider.Column(std::move(w), groups)
                                      : provider.Row(std::move(w));
    w.packed = i > 0;
    local_out_ += w.shape[0];
    weights_.push_back(table.Add(std::move(w)));
  }
  for (size_t i = 0; i < specs.size() && specs[0].bias; ++i) {
    ParamSpec b = Bias(specs[i].name + ".bias", specs[i].out);
    // A row-parallel bias is whole: added once, after the sum over the pieces.
    if (split == LinearSplit::kColumn) b = provider.Column(std::move(b), groups);
    b.packed = i > 0;
    biases_.push_back(table.Add(std::move(b)));
  }
}

namespace {

// FNV-1a of a name: a dropout mask's per-adapter part (Note [LoRA dropout]).
uint64_t NameHash(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
  return h;
}

// A run of packed views as one tensor (ParamSpec::packed): they lie back to back, which the
// engine guarantees and this checks; the rows add up.
Tensor Packed(const ParamViews& v, const std::vector<int>& indices, bool grads) {
  if (indices.empty()) return Tensor();
  const Tensor first = grads ? v.grad(indices[0]) : v.param(indices[0]);
  // One view, or a frozen run's gradients (none: a packed run trains whole or not at all).
  if (indices.size() == 1 || !first.defined()) return first;
  const char* end = static_cast<const char*>(first.data());
  Shape shape = first.shape();
  shape[0] = 0;
  for (int i : indices) {
    const Tensor t = grads ? v.grad(i) : v.param(i);
    ZTRAIN_ASSERT(t.data() == end, "packed parameter views are not contiguous");
    end += t.nbytes();
    shape[0] += t.size(0);
  }
  return Tensor(first.data(), first.dtype(), shape, first.device());
}

// The geometry of the piece a weight's spec holds (kernels::QuantGeometry): all of it, a
// column-parallel slice (rows of each of its groups) or a row-parallel one (columns). 4-bit
// blocks must not straddle pieces: ConfigError naming the weight otherwise.
kernels::QuantGeometry PieceGeometry(const ParamSpec& w, const kernels::QuantFormat& format) {
  const int64_t rows = w.shape[0], cols = w.shape[1];
  if (!w.tp.split()) return kernels::QuantGeometry::Whole(rows, cols);
  const TensorSlice& t = w.tp;
  const int64_t whole_rows = t.full_shape[0], whole_cols = t.full_shape[1];
  kernels::QuantGeometry g{.rows = rows,
                           .cols = cols,
                           .whole_rows = whole_rows,
                           .whole_cols = whole_cols,
                           .group_rows = rows,
                           .whole_group_rows = whole_rows,
                           .row_offset = 0,
                           .col_offset = 0};
  if (t.dim == 0) {
    g.group_rows = rows / t.groups;
    g.whole_group_rows = whole_rows / t.groups;
    g.row_offset = t.part * g.group_rows;
  } else {
    g.col_offset = t.part * cols;
  }
  const int64_t block = kernels::kQuantBlock;
  ZTRAIN_CHECK_T(ConfigError,
                 format.type == kernels::QuantType::kInt8 ||
                     (cols % block == 0 && whole_cols % block == 0),
                 "quantization.load_in_4bit: ", w.name, " ", ShapeToString(t.full_shape),
                 " is split over tensor_parallel_size = ", t.parts, " pieces of ", cols,
                 " columns, and 4-bit blocks of ", block,
                 " elements would straddle the pieces; use a tensor_parallel_size that leaves a "
                 "multiple of ", block,
                 " columns a piece, or list the linear in quantization.llm_int8_skip_modules");
  return g;
}

}  // namespace

Tensor Linear::weight(const ParamViews& v) const { return Packed(v, weights_, false); }
Tensor Linear::dweight(const ParamViews& v) const { return Packed(v, weights_, true); }
Tensor Linear::bias(const ParamViews& v) const { return Packed(v, biases_, false); }
Tensor Linear::dbias(const ParamViews& v) const { return Packed(v, biases_, true); }

int64_t Linear::local_weight_elements() const {
  int64_t n = local_out_ * local_in_;
  for (const Adapter& a : adapters_) n += a.r * (local_in_ + a.out);
  return n;
}

Tensor Linear::ComputeWeight(LayerContext& ctx, const ParamViews& v, Buffer& hold) const {
  if (quantized_.empty()) return weight(v);
  hold = Buffer(ctx.allocator(), ctx.dtype(), {local_out_, local_in_}, MemoryCategory::kWorkspace);
  const Tensor w = hold.AsTensor(ctx.dtype(), {local_out_, local_in_});
  int64_t row = 0;
  for (size_t i = 0; i < weights_.size(); ++i) {
    const auto& [format, geometry] = quantized_[i];
    ctx.ops().Dequantize(v.param(weights_[i]), format, geometry,
                         w.Flat(row * local_in_, {geometry.rows, local_in_}));
    row += geometry.rows;
  }
  return w;
}

void Linear::Forward(LayerContext& ctx, const ParamViews& v, const Tensor& x,
                     const Tensor& y) const {
  {
    Buffer hold;
    ctx.ops().LinearForward(x, ComputeWeight(ctx, v, hold), bias(v), y);
  }
  for (const Adapter& a : adapters_) {
    AddAdapterOutput(ctx, v, a, AdapterInput(ctx, nullptr, v, a, x), y);
  }
}

void Linear::ForwardAdd(LayerContext& ctx, const LinearProvider& p, const ParamViews& v,
                        const Tensor& x, const Tensor& residual, const Tensor& y) const {
  {
    Buffer hold;
    p.RowForward(ctx, x, ComputeWeight(ctx, v, hold), bias(v), residual, y);
  }
  for (const Adapter& a : adapters_) {
    const Tensor u = AdapterInput(ctx, &p, v, a, x);
    // Under sequence parallelism y holds this piece's rows (Note [Sequence parallelism]).
    const int64_t rows = y.size(0);
    AddAdapterOutput(ctx, v, a, rows == u.size(0) ? u : u.Flat(p.rank() * rows * a.r, {rows, a.r}),
                     y);
  }
}

void Linear::BackwardRow(LayerContext& ctx, const ParamViews& v, const Tensor& dy,
                         const Tensor& x, const Tensor& dx) const {
  kernels::Ops& ops = ctx.ops();
  {
    Buffer hold;
    ops.LinearBackward(dy, x, ComputeWeight(ctx, v, hold), dx, dweight(v), dbias(v));
  }
  for (const Adapter& a : adapters_) {
    const Buffer hold(ctx.allocator(), DType::kF32, {x.size(0), a.r}, MemoryCategory::kWorkspace);
    const Tensor du = hold.AsTensor(DType::kF32, {x.size(0), a.r});
    ops.LinearBackward(dy, ctx.Saved(a.name + ".lora_u"), v.param(a.b), du, v.grad(a.b), Tensor());
    ops.Scale(du, a.scaling);
    AddInputGrad(ctx, v, a, du, dx);
    ops.LinearBackward(du, AdapterX(ctx, a, x), v.param(a.a), Tensor(), v.grad(a.a), Tensor());
  }
}

void Linear::Grads(LayerContext& ctx, const ParamViews& v, const Tensor& dy,
                   std::vector<LinearGrad>& out) const {
  kernels::Ops& ops = ctx.ops();
  Buffer hold;
  const Tensor w = ComputeWeight(ctx, v, hold);
  out.push_back({dy, w, dweight(v), dbias(v), std::move(hold)});
  const int64_t n = dy.size(0);
  for (const Adapter& a : adapters_) {
    Tensor dy_a = dy;  // the declared linear's columns of dy
    Buffer hold;
    if (a.out != dy.size(1)) {
      hold = Buffer(ctx.allocator(), dy.dtype(), {n, a.out}, MemoryCategory::kWorkspace);
      dy_a = hold.AsTensor(dy.dtype(), {n, a.out});
      ops.CopyColumns(dy, a.column, dy_a);
    }
    const Tensor du = ctx.Save(a.name + ".lora_du", DType::kF32, {n, a.r});
    ops.LinearBackward(dy_a, ctx.Saved(a.name + ".lora_u"), v.param(a.b), du, v.grad(a.b),
                       Tensor());
    ops.Scale(du, a.scaling);
    // dx += du A; a dropped adapter's term waits for the summed du (FinishGrads).
    if (!MaskOf(ctx, a)) out.push_back({du, v.param(a.a), Tensor(), Tensor(), Buffer()});
  }
}

void Linear::FinishGrads(LayerContext& ctx, const LinearProvider& p, const ParamViews& v,
                         const Tensor& x, const Tensor& dx) const {
  for (const Adapter& a : adapters_) {
    const Tensor du = ctx.Saved(a.name + ".lora_du");
    p.SumOverPieces(ctx, du);
    if (MaskOf(ctx, a)) AddInputGrad(ctx, v, a, du, dx, p.rank());
    ctx.ops().LinearBackward(du, AdapterX(ctx, a, x), v.param(a.a), Tensor(), v.grad(a.a),
                             Tensor());
  }
}

std::optional<kernels::DropoutMask> Linear::MaskOf(const LayerContext& ctx,
                                                   const Adapter& a) const {
  if (a.dropout <= 0.0f || !ctx.dropout()) return std::nullopt;
  const LayerContext::Dropout& d = *ctx.dropout();
  return kernels::DropoutMask{kernels::MixBits(d.key ^ a.id),
                              a.dropout,
                              d.row_offset,
                              a.col_offset,
                              d.run,
                              d.whole_run,
                              d.runs,
                              d.second_run};
}

Tensor Linear::AdapterX(const LayerContext& ctx, const Adapter& a, const Tensor& x) const {
  return MaskOf(ctx, a) ? ctx.Saved(a.name + ".lora_x") : x;
}

void Linear::AddInputGrad(LayerContext& ctx, const ParamViews& v, const Adapter& a,
                          const Tensor& du, const Tensor& dx, int piece) const {
  kernels::Ops& ops = ctx.ops();
  const std::optional<kernels::DropoutMask> mask = MaskOf(ctx, a);
  const int64_t rows = dx.size(0), cols = dx.size(1);
  if (!mask && rows == du.size(0)) {
    ops.Gemm(false, false, 1.0f, du, v.param(a.a), 1.0f, dx);  // dx += du A
    return;
  }
  // Every row's term (masked as the input was: the mask is of the whole micro-batch's rows),
  // then this piece's rows of it when dx holds only those.
  const Shape whole{du.size(0), cols};
  const Buffer hold(ctx.allocator(), dx.dtype(), whole, MemoryCategory::kWorkspace);
  const Tensor t = hold.AsTensor(dx.dtype(), whole);
  ops.Gemm(false, false, 1.0f, du, v.param(a.a), 0.0f, t);
  if (mask) ops.Dropout(t, *mask, t);
  ops.AddInPlace(dx, rows == du.size(0) ? t : t.Flat(piece * rows * cols, {rows, cols}));
}

Tensor Linear::AdapterInput(LayerContext& ctx, const LinearProvider* p, const ParamViews& v,
                            const Adapter& a, const Tensor& x) const {
  const Tensor u = ctx.Save(a.name + ".lora_u", DType::kF32, {x.size(0), a.r});
  Tensor in = x;
  if (const std::optional<kernels::DropoutMask> mask = MaskOf(ctx, a)) {
    in = ctx.Save(a.name + ".lora_x", x.dtype(), x.shape());
    ctx.ops().Dropout(x, *mask, in);
  }
  ctx.ops().LinearForward(in, v.param(a.a), Tensor(), u);
  if (p != nullptr) p->SumOverPieces(ctx, u);  // row-parallel: x and A are the piece's
  ctx.ops().Scale(u, a.scaling);
  return u;
}

void Linear::AddAdapterOutput(LayerContext& ctx, const ParamViews& v, const Adapter& a,
                              const Tensor& u, const Tensor& y) const {
  kernels::Ops& ops = ctx.ops();
  if (a.out == y.size(1)) {
    ops.Gemm(false, true, 1.0f, u, v.param(a.b), 1.0f, y);  // y += u B^T
    return;
  }
  const Buffer hold(ctx.allocator(), y.dtype(), {y.size(0), a.out}, MemoryCategory::kWorkspace);
  const Tensor d = hold.AsTensor(y.dtype(), {y.size(0), a.out});
  ops.LinearForward(u, v.param(a.b), Tensor(), d);
  ops.AddColumns(y, a.column, d, 1.0f);
}

void Linear::Adapt(const AdapterPlan& plan, int block, const LinearProvider& provider,
                   ParamTable& table) {
  int64_t column = 0;
  bool packed_trains = false;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const LinearSpec& s = specs_[i];
    const std::optional<LoraAdapter> lora = plan.Lora(s.name, block);
    ParamSpec& w = table.at(weights_[i]);
    w.trainable = plan.Trains(w.name, false, lora.has_value());
    if (i < biases_.size()) {
      ParamSpec& b = table.at(biases_[i]);
      b.trainable = plan.Trains(b.name, true, lora.has_value());
    }
    // A packed run is one tensor in every buffer: all of it trains or none.
    ZTRAIN_CHECK_T(ConfigError, i == 0 || w.trainable == packed_trains,
                   "lora.modules_to_save trains ", table.at(weights_[0]).name, " or ", w.name,
                   " but not both; ztrain computes ", specs_[0].name,
                   " and the linears packed "
                   "with it in one GEMM: train all of them or none");
    packed_trains = w.trainable;
    const kernels::QuantFormat quant =
        w.trainable ? kernels::QuantFormat{} : plan.Quantization(s.name);
    if (quant.type != kernels::QuantType::kNone) {
      w.quant = quant;
      w.quant_geometry = PieceGeometry(w, quant);
      w.packed = false;  // dequantized into one weight by ComputeWeight, not bound as a run
      quantized_.emplace_back(quant, w.quant_geometry);
    }
    ZTRAIN_CHECK_T(ConfigError, quantized_.size() == (quantized_.empty() ? 0 : i + 1),
                   "quantization.llm_int8_skip_modules leaves ", table.at(weights_[0]).name,
                   " or ", w.name, " unquantized but not both; ztrain computes ", specs_[0].name,
                   " and the linears packed with it in one GEMM: skip all of them or none");
    const int64_t out = w.shape[0];
    if (lora) {
      ParamSpec lora_a = Weight(s.name + ".lora_A.weight", {lora->r, s.in});
      ParamSpec lora_b = Weight(s.name + ".lora_B.weight", {s.out, lora->r});
      AdapterPlan::InitA(*lora, s.in, lora_a);
      AdapterPlan::InitB(*lora, lora_b);
      int64_t col_offset = 0;
      if (split_ == LinearSplit::kColumn) {
        lora_b = provider.Column(std::move(lora_b), groups_);
      } else {
        lora_a = provider.Row(std::move(lora_a));
        col_offset = provider.rank() * lora_a.shape[1];
      }
      const uint64_t id = kernels::MixBits(NameHash(s.name) + static_cast<uint64_t>(block));
      adapters_.push_back({s.name, table.Add(std::move(lora_a)), table.Add(std::move(lora_b)),
                           column, out, lora->r, lora->scaling, lora->dropout, id, col_offset});
    }
    column += out;
  }
  if (biases_.size() > 1) {
    for (size_t i = 1; i < biases_.size(); ++i) {
      ZTRAIN_CHECK_T(ConfigError, table.at(biases_[i]).trainable == table.at(biases_[0]).trainable,
                     "lora.bias \"lora_only\" trains ", table.at(biases_[0]).name, " or ",
                     table.at(biases_[i]).name, " but not both; ztrain computes ", specs_[0].name,
                     " and the linears packed with it in one GEMM: adapt all "
                     "of them or none, or use lora.bias \"all\" or \"none\"");
    }
  }
}

// ---- Attention -----------------------------------------------------------------------------

namespace {

std::vector<LinearSpec> QkvSpecs(const AttentionSpec& s, int64_t c) {
  const int64_t q = int64_t{s.n_head} * s.head_dim, kv = int64_t{s.n_kv_head} * s.head_dim;
  if (!s.qkv.empty()) return {{s.qkv, c, q + 2 * kv, s.qkv_bias}};
  return {{s.q, c, q, s.qkv_bias}, {s.k, c, kv, s.qkv_bias}, {s.v, c, kv, s.qkv_bias}};
}

}  // namespace

Attention::Attention(const AttentionSpec& s, int64_t channels, const LinearProvider& provider,
                     ParamTable& table)
    : inv_freq_(s.rope_inv_freq),
      rope_scale_(s.rope_scale),
      rope_for_length_(s.rope_for_length),
      window_(s.window) {
  ZTRAIN_ASSERT(s.n_head > 0 && s.n_kv_head > 0 && s.n_head % s.n_kv_head == 0 &&
                s.n_kv_head % provider.size() == 0 && s.head_dim > 0);
  ZTRAIN_ASSERT(inv_freq_.empty() || static_cast<int>(inv_freq_.size()) * 2 == s.head_dim);
  // A fused GPT-2 c_attn is 3 equal blocks (q, k, v) split piece by piece; separate q, k and v
  // are each split, and packed.
  qkv_ = Linear(QkvSpecs(s, channels), LinearSplit::kColumn, provider, table,
                s.qkv.empty() ? 1 : 3);
  o_ = Linear({{s.o, int64_t{s.n_head} * s.head_dim, channels, s.o_bias, s.o_std}},
              LinearSplit::kRow, provider, table);
  heads_ = {s.n_head / provider.size(), s.n_kv_head / provider.size(), s.head_dim};
  const ContextGroup* cp = provider.context();
  if (cp != nullptr && cp->algorithm() == ContextAlgorithm::kUlysses) {
    ulysses_.emplace(heads_, cp->size());
  }
}

Tensor Attention::InvFreq(LayerContext& ctx, int64_t seq_len) const {
  const auto half = static_cast<int64_t>(inv_freq_.size());
  const std::vector<float>* freq = &inv_freq_;
  if (rope_for_length_) {  // dynamic: this length's frequencies, kept until the length changes
    if (seq_len != length_freq_for_) {
      length_freq_ = rope_for_length_(seq_len);
      length_freq_for_ = seq_len;
    }
    freq = &length_freq_;
  }
  const Tensor host(const_cast<float*>(freq->data()), DType::kF32, {half});
  if (ctx.ops().device().is_cpu()) return host;
  const Tensor on_device = ctx.Scratch(DType::kF32, {half});
  ctx.ops().Copy(host, on_device);
  return on_device;
}

void Attention::Forward(LayerContext& ctx, const LinearProvider& p, const ParamViews& v,
                        const MicroBatch& mb, const Tensor& x, const Tensor& residual,
                        const Tensor& y) const {
  kernels::Ops& ops = ctx.ops();
  const int64_t batch = mb.B(), n = x.size(0), t = n / batch, width = heads_.qkv_width();
  const ContextGroup* cp = p.context();
  const bool ring = cp != nullptr && cp->algorithm() == ContextAlgorithm::kRing;
  // Under Ulysses this rank's q/k/v go to the head groups at once: held only until then (Note
  // [Context parallelism]).
  Buffer local;
  const Tensor qkv =
      cp == nullptr || ring
          ? ctx.Save("qkv", ctx.dtype(), {n, width})
          : (local = Buffer(ctx.allocator(), ctx.dtype(), {n, width}, MemoryCategory::kWorkspace))
                .AsTensor(ctx.dtype(), {n, width});
  qkv_.Forward(ctx, v, x, qkv);
  const Tensor qkv3 = qkv.View({batch, t, width});
  if (!inv_freq_.empty()) {
    ops.RopeForward(qkv3, heads_, InvFreq(ctx, RopeLength(p, mb, t)), 0, rope_scale_, mb.positions);
  }
  const Tensor att = ctx.Save("att", ctx.dtype(), {n, heads_.q_width()});
  if (cp == nullptr) {
    const Tensor lse = ctx.Save("lse", DType::kF32, {batch, heads_.num_heads, t});
    ops.AttentionForward(qkv3, heads_, Mask(mb.positions), att.View({batch, t, heads_.q_width()}),
                         lse);
  } else if (ring) {  // Note [Ring attention]
    const Tensor lse = ctx.Save("lse", DType::kF32, {batch * heads_.num_heads * t});
    cp->RingForward(ctx, heads_, window_, DocumentPositions(mb), batch, qkv, att, lse);
  } else {  // the whole sequence of this rank's head group
    const kernels::AttentionHeads& group = ulysses_->group();
    const int64_t whole = t * cp->size();
    const Tensor group_qkv = ctx.Save("qkv", ctx.dtype(), {batch * whole, group.qkv_width()});
    cp->SequenceToHeads(ctx, *ulysses_, /*with_kv=*/true, batch, qkv, group_qkv);
    local = Buffer();
    const Tensor group_att = ctx.Save("group_att", ctx.dtype(), {batch * whole, group.q_width()});
    const Tensor lse = ctx.Save("lse", DType::kF32, {batch, group.num_heads, whole});
    ops.AttentionForward(group_qkv.View({batch, whole, group.qkv_width()}), group,
                         Mask(mb.whole_positions), group_att.View({batch, whole, group.q_width()}),
                         lse);
    cp->HeadsToSequence(ctx, *ulysses_, /*with_kv=*/false, batch, group_att, att);
  }
  o_.ForwardAdd(ctx, p, v, att, residual, y);
}

void Attention::Decode(LayerContext& ctx, const LinearProvider& p, const ParamViews& v,
                       KvCache& cache, int64_t first, int64_t capacity, Allocator& cache_allocator,
                       const Tensor& x, const Tensor& residual, const Tensor& y) const {
  kernels::Ops& ops = ctx.ops();
  const int64_t t = x.size(0), width = heads_.qkv_width(), kvw = heads_.kv_width();
  ZTRAIN_CHECK(first == cache.length && first + t <= capacity, "decoding positions ", first,
               "..", first + t - 1, " over a cache of ", cache.length, " of at most ", capacity);
  // Note [Windowed KV cache]: with a sliding window the cache has only `window` rows and
  // position p lives in row p % window. After p is written the rows hold exactly the keys p
  // sees (in rotated order, which the softmax does not see), so each new position attends over
  // all the rows filled so far, one position at a time; a prompt from the start runs the
  // training kernel under the window and leaves its last `window` positions in the cache.
  const int64_t rows = window_ > 0 ? std::min(capacity, window_) : capacity;
  if (cache.k.nbytes() == 0) {
    cache.k = Buffer(cache_allocator, DType::kF32, {rows, kvw}, MemoryCategory::kActivations);
    cache.v = Buffer(cache_allocator, DType::kF32, {rows, kvw}, MemoryCategory::kActivations);
  }
  const Tensor qkv = ctx.Scratch(DType::kF32, {t, width});
  qkv_.Forward(ctx, v, x, qkv);
  if (!inv_freq_.empty()) {  // the frequencies of the sequence so far (dynamic NTK grows them)
    ops.RopeForward(qkv.View({1, t, width}), heads_, InvFreq(ctx, first + t), first, rope_scale_);
  }
  const float* new_rows = qkv.data<float>();
  auto store = [&](int64_t i) {  // position first + i into its cache row
    const float* row = new_rows + i * width + heads_.q_width();
    const int64_t r = (first + i) % rows;
    std::copy(row, row + kvw, cache.k.data<float>() + r * kvw);
    std::copy(row + kvw, row + 2 * kvw, cache.v.data<float>() + r * kvw);
  };
  auto cached = [&](const Buffer& b, int64_t n) { return b.AsTensor(DType::kF32, {n, kvw}); };
  const Tensor att = ctx.Scratch(DType::kF32, {t, heads_.q_width()});
  if (first == 0 && t > 1) {  // a prompt from the start: the training kernel's tiles
    for (int64_t i = 0; i < t; ++i) store(i);
    const Tensor lse = ctx.Scratch(DType::kF32, {1, heads_.num_heads, t});
    ops.AttentionForward(qkv.View({1, t, width}), heads_, Mask(Tensor()),
                         att.View({1, t, heads_.q_width()}), lse);
  } else if (window_ == 0) {
    for (int64_t i = 0; i < t; ++i) store(i);
    ops.AttentionDecode(qkv, cached(cache.k, first + t), cached(cache.v, first + t), heads_, att);
  } else {
    for (int64_t i = 0; i < t; ++i) {
      store(i);
      const int64_t filled = std::min(first + i + 1, rows);
      ops.AttentionDecode(qkv.Slice(i, i + 1), cached(cache.k, filled), cached(cache.v, filled),
                          heads_, att.Slice(i, i + 1));
    }
  }
  cache.length = first + t;
  o_.ForwardAdd(ctx, p, v, att, residual, y);
}

void Attention::Backward(LayerContext& ctx, const LinearProvider& p, const ParamViews& v,
                         const MicroBatch& mb, const Tensor& dy, const Tensor& x,
                         const Tensor& dx) const {
  kernels::Ops& ops = ctx.ops();
  const int64_t batch = mb.B(), n = x.size(0), t = n / batch, width = heads_.qkv_width();
  const int64_t qw = heads_.q_width();
  const ContextGroup* cp = p.context();
  const Tensor datt = ctx.Scratch(ctx.dtype(), {n, qw});
  o_.BackwardRow(ctx, v, dy, ctx.Saved("att"), datt);
  const Tensor dqkv = ctx.Scratch(ctx.dtype(), {n, width});
  const Tensor dqkv3 = dqkv.View({batch, t, width});
  if (cp == nullptr) {
    ops.AttentionBackward(datt.View({batch, t, qw}), ctx.Saved("qkv").View({batch, t, width}),
                          ctx.Saved("att").View({batch, t, qw}), ctx.Saved("lse"), heads_,
                          Mask(mb.positions), dqkv3);
  } else if (cp->algorithm() == ContextAlgorithm::kRing) {  // Note [Ring attention]
    cp->RingBackward(ctx, heads_, window_, DocumentPositions(mb), batch, datt, ctx.Saved("qkv"),
                     ctx.Saved("att"), ctx.Saved("lse"), dqkv);
  } else {  // Note [Context parallelism]: the exchanges of Forward, mirrored
    const kernels::AttentionHeads& group = ulysses_->group();
    const int64_t whole = t * cp->size(), gw = group.qkv_width(), gq = group.q_width();
    const Tensor group_datt = ctx.Scratch(ctx.dtype(), {batch * whole, gq});
    cp->SequenceToHeads(ctx, *ulysses_, /*with_kv=*/false, batch, datt, group_datt);
    const Tensor group_dqkv = ctx.Scratch(ctx.dtype(), {batch * whole, gw});
    ops.AttentionBackward(group_datt.View({batch, whole, gq}),
                          ctx.Saved("qkv").View({batch, whole, gw}),
                          ctx.Saved("group_att").View({batch, whole, gq}), ctx.Saved("lse"), group,
                          Mask(mb.whole_positions), group_dqkv.View({batch, whole, gw}));
    cp->HeadsToSequence(ctx, *ulysses_, /*with_kv=*/true, batch, group_dqkv, dqkv);
  }
  if (!inv_freq_.empty()) {
    ops.RopeBackward(dqkv3, heads_, InvFreq(ctx, RopeLength(p, mb, t)), rope_scale_, mb.positions);
  }
  std::vector<LinearGrad> g;
  qkv_.Grads(ctx, v, dqkv, g);
  p.ColumnBackward(ctx, g, x, dx);
  qkv_.FinishGrads(ctx, p, v, x, dx);
}

void Attention::Adapt(const AdapterPlan& plan, int block, const LinearProvider& provider,
                      ParamTable& table) {
  qkv_.Adapt(plan, block, provider, table);
  o_.Adapt(plan, block, provider, table);
}

int64_t Attention::RopeLength(const LinearProvider& p, const MicroBatch& mb,
                              int64_t seq_len) const {
  // Under context parallelism the sequence is the cp group's pieces together, and the
  // documents are the whole sequence's.
  const ContextGroup* cp = p.context();
  const int64_t length = cp == nullptr ? seq_len : seq_len * cp->size();
  const Tensor& positions = cp == nullptr ? mb.positions : mb.whole_positions;
  if (!rope_for_length_ || !positions.defined() || !positions.device().is_cpu()) return length;
  const int32_t* pos = positions.data<int32_t>();
  return int64_t{*std::max_element(pos, pos + positions.numel())} + 1;
}

// Under context parallelism with packed documents (whole_positions defined) this rank's rows'
// document positions; otherwise none (the ring's offsets make the mask causal).
Tensor Attention::DocumentPositions(const MicroBatch& mb) {
  return mb.whole_positions.defined() ? mb.positions : Tensor();
}

kernels::AttentionMask Attention::Mask(const Tensor& positions) const {
  return {window_, positions};
}

double Attention::ForwardFlopsPerToken(int64_t seq_len) const {
  // The projections, plus causal attention: q.k and p.v over on average T/2 keys, or under a
  // window W < T over (W (W + 1) / 2 + (T - W) W) / T.
  const double matmuls = static_cast<double>(qkv_.local_weight_elements() +
                                             o_.local_weight_elements());
  const auto t = static_cast<double>(seq_len), w = static_cast<double>(window_);
  const double keys =
      window_ > 0 && window_ < seq_len ? (w * (w + 1) / 2 + (t - w) * w) / t : t / 2.0;
  return 2.0 * matmuls + 2.0 * 2.0 * static_cast<double>(heads_.q_width()) * keys;
}

// ---- Mlp -----------------------------------------------------------------------------------

Mlp::Mlp(const MlpSpec& s, int64_t channels, const LinearProvider& provider, ParamTable& table)
    : kind_(s.kind) {
  if (s.kind == MlpKind::kSwiGlu) {
    gate_ = Linear({{s.gate, channels, s.hidden, s.bias}}, LinearSplit::kColumn, provider, table);
  }
  up_ = Linear({{s.up, channels, s.hidden, s.bias}}, LinearSplit::kColumn, provider, table);
  down_ = Linear({{s.down, s.hidden, channels, s.bias, s.down_std}}, LinearSplit::kRow, provider,
                 table);
}

void Mlp::Forward(LayerContext& ctx, const LinearProvider& p, const ParamViews& v,
                  const Tensor& x, const Tensor& residual, const Tensor& y) const {
  kernels::Ops& ops = ctx.ops();
  const int64_t n = x.size(0), h = up_.local_out();
  if (kind_ == MlpKind::kGelu) {
    const Tensor fch = ctx.Save("fch", ctx.dtype(), {n, h});
    up_.Forward(ctx, v, x, fch);
    const Tensor act = ctx.Save("fch_gelu", ctx.dtype(), {n, h});
    ops.GeluForward(fch, act);
    down_.ForwardAdd(ctx, p, v, act, residual, y);
    return;
  }
  const Tensor gate = ctx.Save("gate", ctx.dtype(), {n, h});
  gate_.Forward(ctx, v, x, gate);
  const Tensor up = ctx.Save("up", ctx.dtype(), {n, h});
  up_.Forward(ctx, v, x, up);
  const Tensor act = ctx.Save("swiglu", ctx.dtype(), {n, h});
  ops.SwiGluForward(gate, up, act);
  down_.ForwardAdd(ctx, p, v, act, residual, y);
}

void Mlp::Backward(LayerContext& ctx, const LinearProvider& p, const ParamViews& v,
                   const Tensor& dy, const Tensor& x, const Tensor& dx) const {
  kernels::Ops& ops = ctx.ops();
  const int64_t n = x.size(0), h = up_.local_out();
  const Tensor dact = ctx.Scratch(ctx.dtype(), {n, h});
  if (kind_ == MlpKind::kGelu) {
    down_.BackwardRow(ctx, v, dy, ctx.Saved("fch_gelu"), dact);
    const Tensor dfch = ctx.Scratch(ctx.dtype(), {n, h});
    ops.GeluBackward(dact, ctx.Saved("fch"), dfch);
    std::vector<LinearGrad> g;
    up_.Grads(ctx, v, dfch, g);
    p.ColumnBackward(ctx, g, x, dx);
    up_.FinishGrads(ctx, p, v, x, dx);
    return;
  }
  down_.BackwardRow(ctx, v, dy, ctx.Saved("swiglu"), dact);
  const Tensor dgate = ctx.Scratch(ctx.dtype(), {n, h});
  const Tensor dup = ctx.Scratch(ctx.dtype(), {n, h});
  ops.SwiGluBackward(dact, ctx.Saved("gate"), ctx.Saved("up"), dgate, dup);
  std::vector<LinearGrad> g;
  gate_.Grads(ctx, v, dgate, g);
  up_.Grads(ctx, v, dup, g);
  p.ColumnBackward(ctx, g, x, dx);
  gate_.FinishGrads(ctx, p, v, x, dx);
  up_.FinishGrads(ctx, p, v, x, dx);
}

void Mlp::Adapt(const AdapterPlan& plan, int block, const LinearProvider& provider,
                ParamTable& table) {
  if (kind_ == MlpKind::kSwiGlu) gate_.Adapt(plan, block, provider, table);
  up_.Adapt(plan, block, provider, table);
  down_.Adapt(plan, block, provider, table);
}

double Mlp::ForwardFlopsPerToken() const {
  const int64_t gate = kind_ == MlpKind::kSwiGlu ? gate_.local_weight_elements() : 0;
  return 2.0 * static_cast<double>(gate + up_.local_weight_elements() +
                                   down_.local_weight_elements());
}

}  // namespace ztrain::nn
