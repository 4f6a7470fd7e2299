#pragma once
// The shared modules every model family is built from (DESIGN.md "Model families"): norm
// (LayerNorm | RMSNorm), linear (whole, column- or row-parallel through a LinearProvider),
// attention (query and key/value heads, learned positions or RoPE, bias flags) and MLP
// (GELU | SwiGLU). A module is a part of a layer, not a layer: it adds its parameters to the
// layer's ParamTable when it is made, remembers their indices, and computes on the layer's
// bound views (ParamViews), saving what its backward needs in the layer's context under keys
// the layer gives. The layers made of them are in nn/transformer.h; the families choose the
// specs (nn/gpt2.cc, nn/llama.cc).
//
// A family's names for its parameters are given in the specs ("attn.c_attn" for GPT-2,
// "self_attn.q_proj" for Llama); the modules add ".weight" / ".bias". Not thread safe, like
// the layers.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/adapters.h"
#include "nn/layer.h"
#include "nn/linear_provider.h"

namespace ztrain::nn {

// A layer's parameter specs as its modules add them; indices are positions in Params().
class ParamTable {
 public:
  int Add(ParamSpec spec);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  ParamSpec& at(int i) { return specs_.at(static_cast<size_t>(i)); }

 private:
  std::vector<ParamSpec> specs_;
};

// ParamSpecs of the usual kinds: a matrix or embedding (normal(0, std), weight decay on), a
// bias (zeros, no decay), a norm weight (ones, no decay).
ParamSpec Weight(std::string name, Shape shape, float std = 0.02f);
ParamSpec Bias(std::string name, int64_t n);
ParamSpec NormWeight(std::string name, int64_t n);

enum class NormKind { kLayerNorm, kRmsNorm };

struct NormSpec {
  NormKind kind = NormKind::kLayerNorm;
  float eps = 1e-5f;  // LayerNorm: the op's 1e-5 (checked)
};

// LayerNorm (weight and bias) or RMSNorm (weight) over the last dimension.
class Norm {
 public:
  Norm() = default;
  Norm(const NormSpec& spec, const std::string& name, int64_t channels, ParamTable& table);
  // y = norm(x) for x [N, C], saved under `key` with its statistics (`key`.mean, `key`.rstd).
  Tensor Forward(LayerContext& ctx, const ParamViews& v, const std::string& key,
                 const Tensor& x) const;
  // dx (overwritten) from dy; the parameter gradients accumulate. With `rows_of` a provider
  // under sequence parallelism, x holds its piece's rows only (Note [Sequence parallelism]):
  // the parameter gradients are then summed over the pieces before they accumulate.
  void Backward(LayerContext& ctx, const ParamViews& v, const std::string& key, const Tensor& dy,
                const Tensor& x, const Tensor& dx, const LinearProvider* rows_of = nullptr) const;
  // Freezes what `plan` does not train (Note [Adapters and frozen parameters]).
  void Adapt(const AdapterPlan& plan, ParamTable& table) const;

 private:
  NormSpec spec_;
  int weight_ = -1, bias_ = -1;
};

enum class LinearSplit { kColumn, kRow };

// One linear's declaration: `name` ("mlp.c_fc"), features, bias, initial std.
struct LinearSpec {
  std::string name;
  int64_t in = 0, out = 0;
  bool bias = false;
  float std = 0.02f;
};

// A linear y = x W^T + b, W [out, in], split as `split` says over the provider's pieces. A
// column-parallel linear may pack several declared linears (q, k and v) into one: their
// weights (and biases) lie back to back in the layer's flat buffer (ParamSpec::packed), so
// the packed weight is one [sum of outs, in] matrix and one GEMM computes them all.
//
// Note [LoRA in the linears]
// Adapt gives each declared linear the plan targets its adapters A [r, in] and B [out, r]
// (PEFT's lora_A, lora_B), split with the base weight: a column-parallel linear's B takes
// W's rows (A is whole), a row-parallel linear's A takes W's columns (B is whole). Then
//   y += s (x A^T) B^T,   s = lora_alpha / r (or / sqrt(r)),
// after the base linear, into the declared linear's columns of y (a packed q/k/v's are a
// window of y's columns, Ops::AddColumns). u = s x A^T is computed in fp32 and saved (N x r:
// small); a row-parallel linear sums it over the pieces first (its x is split), so every
// piece adds the whole s u B^T after the base linear's all-reduce. Backward, from dy:
//   dB += dy^T u,  du = s dy B,  dA += du^T x,  dx += du A.
// In a column-parallel linear dy and B are the piece's rows, so du is a partial sum: its
// dx term joins the base weight's in the provider's ColumnBackward (whose all-reduce of dx
// sums it), and du is summed over the pieces (LinearProvider::SumOverPieces) before dA.
// A row-parallel linear needs no collective in backward. With one piece every sum is the
// single-process op sequence.
//
// Note [LoRA dropout]
// With lora_dropout p > 0 an adapter reads dropout(x) instead of x while training, as PEFT's
// lora_A(dropout(x)): u = s dropout(x) A^T, saved with the dropped input xd (N x in, the
// memory PyTorch's autograd keeps too), and backward gives dA += du^T xd and
// dx += dropout(du A) with the same mask. The mask (kernels/dropout.h) is a hash of the
// micro-batch's key (training.seed, the step, the micro-batch: LayerContext::dropout, set by
// the engine for training forwards only), the adapter (its name and block) and the element's
// place in the single-process tensor (global token row, whole input column), so data-,
// pipeline- and tensor-parallel layouts and a recomputed checkpointed block all drop the same
// elements. In a column-parallel linear the masked dx term cannot ride the provider's
// all-reduce (which sums dy W terms), so FinishGrads adds it to the reduced dx on every piece
// from the summed du; a row-parallel linear's piece masks its own columns.
//
// A quantized base weight (Note [Quantized base] in nn/adapters.h) is dequantized into the
// compute dtype, every declared linear's rows of the packed weight, by each computation that
// reads it (ComputeWeight) and freed after it.
class Linear {
 public:
  Linear() = default;
  Linear(std::vector<LinearSpec> specs, LinearSplit split, const LinearProvider& provider,
         ParamTable& table, int groups = 1);
  // Freezes the weights, trains the biases `plan` trains, and adds adapters to each declared
  // linear it targets in block `block` (Note [LoRA in the linears]). FinishGrads adds the
  // dropped adapters' dx terms to dx (Note [LoRA dropout]).
  void Adapt(const AdapterPlan& plan, int block, const LinearProvider& provider, ParamTable& table);
  int64_t local_out() const { return local_out_; }
  // The weight elements this piece multiplies per token, adapters' included (FLOP counts).
  int64_t local_weight_elements() const;
  Tensor weight(const ParamViews& v) const;
  Tensor bias(const ParamViews& v) const;  // undefined without biases
  Tensor dweight(const ParamViews& v) const;
  Tensor dbias(const ParamViews& v) const;
  // y = x W^T + b (column-parallel: this piece's output features), adapters added.
  void Forward(LayerContext& ctx, const ParamViews& v, const Tensor& x, const Tensor& y) const;
  // Row-parallel: y = residual + x W^T (summed over the pieces) + b, adapters added.
  void ForwardAdd(LayerContext& ctx, const LinearProvider& p, const ParamViews& v,
                  const Tensor& x, const Tensor& residual, const Tensor& y) const;
  // Column-parallel backward, in two halves around the provider's ColumnBackward of every
  // linear that reads x: Grads appends this linear's terms of dx (its weight's, and each
  // adapter's A with du) and accumulates the adapters' dB; FinishGrads, after it, sums each
  // du over the pieces and accumulates dA.
  void Grads(LayerContext& ctx, const ParamViews& v, const Tensor& dy,
             std::vector<LinearGrad>& out) const;
  void FinishGrads(LayerContext& ctx, const LinearProvider& p, const ParamViews& v,
                   const Tensor& x, const Tensor& dx) const;
  // Row-parallel backward: dx = dy W (this piece's input features), dW, db and the
  // adapters' gradients accumulate.
  void BackwardRow(LayerContext& ctx, const ParamViews& v, const Tensor& dy, const Tensor& x,
                   const Tensor& dx) const;

 private:
  struct Adapter {
    std::string name;    // the declared linear's: saved tensors' keys
    int a = -1, b = -1;  // A's and B's indices in the table
    int64_t column = 0;  // the declared linear's first column of this piece's y
    int64_t out = 0;     // its columns of this piece's y
    int64_t r = 0;
    float scaling = 1.0f;
    float dropout = 0.0f;     // lora_dropout
    uint64_t id = 0;          // the mask's: of the declared linear's name and block
    int64_t col_offset = 0;   // this piece's first input column (row-parallel: A's columns)
  };
  // The adapter's dropout mask in this micro-batch, or none (p 0, or not training).
  std::optional<kernels::DropoutMask> MaskOf(const LayerContext& ctx, const Adapter& a) const;
  // The adapter's input: x, or its dropped copy saved in forward.
  Tensor AdapterX(const LayerContext& ctx, const Adapter& a, const Tensor& x) const;
  // dx += du A, masked as the adapter's input was. A dx of fewer rows than du is the rows of
  // piece `piece` (Note [Sequence parallelism]).
  void AddInputGrad(LayerContext& ctx, const ParamViews& v, const Adapter& a, const Tensor& du,
                    const Tensor& dx, int piece = 0) const;
  // u = scaling x A^T in fp32 (summed over the pieces when row-parallel), saved.
  Tensor AdapterInput(LayerContext& ctx, const LinearProvider* p, const ParamViews& v,
                      const Adapter& a, const Tensor& x) const;
  void AddAdapterOutput(LayerContext& ctx, const ParamViews& v, const Adapter& a, const Tensor& u,
                        const Tensor& y) const;
  // The weight [local_out, local_in] the GEMMs read: the bound (packed) view, or the quantized
  // pieces dequantized into `hold`.
  Tensor ComputeWeight(LayerContext& ctx, const ParamViews& v, Buffer& hold) const;

  std::vector<LinearSpec> specs_;
  LinearSplit split_ = LinearSplit::kColumn;
  int groups_ = 1;
  std::vector<int> weights_, biases_;
  std::vector<Adapter> adapters_;
  // Each declared linear's quantized weight (all or none of a packed run), in weights_' order;
  // empty when the weights are not quantized.
  std::vector<std::pair<kernels::QuantFormat, kernels::QuantGeometry>> quantized_;
  int64_t local_out_ = 0, local_in_ = 0;
};

// Attention: n_head query heads and n_kv_head key/value heads of head_dim, from a
// column-parallel q/k/v projection (GPT-2: one fused weight `qkv`; Llama: q, k, v packed)
// and a row-parallel output projection `o`; rotary positions when rope_inv_freq is set.
struct AttentionSpec {
  int n_head = 0, n_kv_head = 0, head_dim = 0;
  std::string qkv;           // the fused projection's name, or empty for separate q, k, v
  std::string q, k, v, o;    // names
  bool qkv_bias = false, o_bias = false;
  float o_std = 0.02f;
  std::vector<float> rope_inv_freq;  // [head_dim / 2]; empty: positions come from elsewhere
  float rope_scale = 1.0f;           // on cos and sin (YaRN's attention factor)
  // Frequencies for a sequence of `seq_len` positions when they depend on it (dynamic NTK
  // scaling, nn::RopeInverseFrequencies); empty: rope_inv_freq always.
  std::function<std::vector<float>(int64_t seq_len)> rope_for_length;
  int64_t window = 0;  // sliding window (kernels::AttentionMask); 0: full causal attention
};

class Attention {
 public:
  Attention() = default;
  Attention(const AttentionSpec& spec, int64_t channels, const LinearProvider& provider,
            ParamTable& table);
  // y = residual + o(attention(qkv(x))): x is the normed input [B,T,C] of micro-batch `mb`
  // as [N,C] (its positions: packed documents', Note [Packed documents]; under context
  // parallelism this rank's piece of the sequences, Note [Context parallelism]).
  void Forward(LayerContext& ctx, const LinearProvider& p, const ParamViews& v,
               const MicroBatch& mb, const Tensor& x, const Tensor& residual,
               const Tensor& y) const;
  // dx (overwritten) from dy, the gradient of y; mb and x are Forward's.
  void Backward(LayerContext& ctx, const LinearProvider& p, const ParamViews& v,
                const MicroBatch& mb, const Tensor& dy, const Tensor& x, const Tensor& dx) const;
  // Forward of T new positions starting at `first` over `cache` (Note [KV cache],
  // nn/decoder.h): appends their keys and values, attends over the cache. fp32, batch 1. With a
  // sliding window the cache holds only the window (Note [Windowed KV cache]).
  void Decode(LayerContext& ctx, const LinearProvider& p, const ParamViews& v, KvCache& cache,
              int64_t first, int64_t capacity, Allocator& cache_allocator, const Tensor& x,
              const Tensor& residual, const Tensor& y) const;
  double ForwardFlopsPerToken(int64_t seq_len) const;
  void Adapt(const AdapterPlan& plan, int block, const LinearProvider& provider, ParamTable& table);

 private:
  // RoPE's frequencies for a sequence of `seq_len` positions, on the op's device.
  Tensor InvFreq(LayerContext& ctx, int64_t seq_len) const;
  // The length dynamic NTK scales for: the sequence's (the whole one's under context
  // parallelism), or with packed documents (host positions) the longest document's,
  // max(position_ids) + 1 as transformers takes it.
  int64_t RopeLength(const LinearProvider& p, const MicroBatch& mb, int64_t seq_len) const;
  // The keys each query sees: the window, and the documents of packed `positions`.
  kernels::AttentionMask Mask(const Tensor& positions) const;
  // Under context parallelism with packed documents this rank's rows' document positions
  // (what ring attention's mask reads), else undefined.
  static Tensor DocumentPositions(const MicroBatch& mb);
  kernels::AttentionHeads heads_;  // this piece's
  std::optional<UlyssesHeads> ulysses_;  // under context parallelism: the head groups
  Linear qkv_, o_;
  std::vector<float> inv_freq_;
  float rope_scale_ = 1.0f;
  std::function<std::vector<float>(int64_t)> rope_for_length_;
  mutable std::vector<float> length_freq_;  // rope_for_length_(length_freq_for_)
  mutable int64_t length_freq_for_ = -1;
  int64_t window_ = 0;
};

enum class MlpKind { kGelu, kSwiGlu };

// GELU: down(gelu(up(x))); SwiGLU: down(silu(gate(x)) * up(x)). up and gate are
// column-parallel, down row-parallel.
struct MlpSpec {
  MlpKind kind = MlpKind::kGelu;
  int64_t hidden = 0;
  std::string gate, up, down;  // names (gate only for SwiGLU)
  bool bias = false;
  float down_std = 0.02f;
};

class Mlp {
 public:
  Mlp() = default;
  Mlp(const MlpSpec& spec, int64_t channels, const LinearProvider& provider, ParamTable& table);
  // y = residual + mlp(x), x [N,C] normed.
  void Forward(LayerContext& ctx, const LinearProvider& p, const ParamViews& v, const Tensor& x,
               const Tensor& residual, const Tensor& y) const;
  void Backward(LayerContext& ctx, const LinearProvider& p, const ParamViews& v, const Tensor& dy,
                const Tensor& x, const Tensor& dx) const;
  double ForwardFlopsPerToken() const;
  void Adapt(const AdapterPlan& plan, int block, const LinearProvider& provider, ParamTable& table);

 private:
  MlpKind kind_ = MlpKind::kGelu;
  Linear gate_, up_, down_;
};

}  // namespace ztrain::nn
