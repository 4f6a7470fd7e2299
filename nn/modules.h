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
#include <memory>
#include <string>
#include <vector>

#include "nn/layer.h"
#include "nn/linear_provider.h"

namespace ztrain::nn {

// A layer's parameter specs as its modules add them; indices are positions in Params().
class ParamTable {
 public:
  int Add(ParamSpec spec);
  const std::vector<ParamSpec>& specs() const { return specs_; }

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
  // dx (overwritten) from dy; the parameter gradients accumulate.
  void Backward(LayerContext& ctx, const ParamViews& v, const std::string& key, const Tensor& dy,
                const Tensor& x, const Tensor& dx) const;

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
class Linear {
 public:
  Linear() = default;
  Linear(std::vector<LinearSpec> specs, LinearSplit split, const LinearProvider& provider,
         ParamTable& table, int groups = 1);
  int64_t local_out() const { return local_out_; }
  // The weight elements this piece multiplies per token (for FLOP counts).
  int64_t local_weight_elements() const { return local_out_ * local_in_; }
  Tensor weight(const ParamViews& v) const;
  Tensor bias(const ParamViews& v) const;  // undefined without biases
  Tensor dweight(const ParamViews& v) const;
  Tensor dbias(const ParamViews& v) const;
  LinearGrad Grad(const ParamViews& v, const Tensor& dy) const;
  // y = x W^T + b (column-parallel: this piece's output features).
  void Forward(LayerContext& ctx, const ParamViews& v, const Tensor& x, const Tensor& y) const;
  // Row-parallel: y = residual + x W^T (summed over the pieces) + b.
  void ForwardAdd(LayerContext& ctx, const LinearProvider& p, const ParamViews& v,
                  const Tensor& x, const Tensor& residual, const Tensor& y) const;
  // Row-parallel backward: dx = dy W (this piece's input features), dW, db accumulate.
  void BackwardRow(LayerContext& ctx, const ParamViews& v, const Tensor& dy, const Tensor& x,
                   const Tensor& dx) const;

 private:
  std::vector<int> weights_, biases_;
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
};

class Attention {
 public:
  Attention() = default;
  Attention(const AttentionSpec& spec, int64_t channels, const LinearProvider& provider,
            ParamTable& table);
  // y = residual + o(attention(qkv(x))): x is the normed input [B,T,C] as [N,C].
  void Forward(LayerContext& ctx, const LinearProvider& p, const ParamViews& v, int64_t batch,
               const Tensor& x, const Tensor& residual, const Tensor& y) const;
  // dx (overwritten) from dy, the gradient of y; x is Forward's.
  void Backward(LayerContext& ctx, const LinearProvider& p, const ParamViews& v, int64_t batch,
                const Tensor& dy, const Tensor& x, const Tensor& dx) const;
  double ForwardFlopsPerToken(int64_t seq_len) const;

 private:
  Tensor InvFreq(LayerContext& ctx) const;
  kernels::AttentionHeads heads_;  // this piece's
  Linear qkv_, o_;
  std::vector<float> inv_freq_;
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

 private:
  MlpKind kind_ = MlpKind::kGelu;
  Linear gate_, up_, down_;
};

}  // namespace ztrain::nn
