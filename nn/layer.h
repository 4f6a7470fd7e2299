#pragma once
// Layer: one step of a model that is an ordered list of layers (DESIGN.md "The model as a
// sequence of layers").
//
// A layer declares its parameters (ParamSpec) and never allocates them: the engine lays all
// of a layer's parameters out in one flat buffer (gradients mirror it) and hands the layer
// views with Bind(). Forward reads its input and writes its output (both allocated by the
// engine) and saves what Backward needs in a per-micro-batch LayerContext; Backward writes
// the input gradient and ACCUMULATES into the parameter gradients. A layer knows nothing of
// ranks, ZeRO or the engine; the same layer object runs many micro-batches, each with its
// own context. Not thread safe: one micro-batch at a time.
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/tensor.h"
#include "kernels/quant.h"
#include "nn/layer_context.h"

namespace ztrain::nn {

class AdapterPlan;  // nn/adapters.h

// kUniform: uniform in [-init_std, init_std) (LoRA's Kaiming-uniform A).
enum class Init { kZeros, kOnes, kNormal, kUniform };

// Tensor parallelism: a parameter that is one rank's slice of a whole parameter of shape
// `full_shape`. Along dimension `dim` the whole is `groups` equal blocks (a fused QKV weight:
// 3, one each for q, k and v), each block cut into `parts` equal pieces (the tp size); this
// rank holds piece `part` of every block, in block order. A column-parallel weight [out, in]
// is dim 0, a row-parallel one dim 1, a vocabulary-parallel embedding dim 0. An empty
// full_shape means the parameter is whole: replicated on every rank of the tp group, with
// equal values and equal gradients there.
struct TensorSlice {
  Shape full_shape;
  int dim = 0;
  int groups = 1;
  int parts = 1;
  int part = 0;
  bool split() const { return !full_shape.empty(); }
};

// Calls fn(local_begin, full_begin, count) for each maximal contiguous run of the slice: the
// run's elements [local_begin, local_begin + count) of the local tensor (shape `local_shape`,
// row-major) are elements [full_begin, full_begin + count) of the whole parameter. Runs come in
// local order and cover the local tensor once. An unsplit slice is one run.
void ForEachSliceRun(const TensorSlice& slice, const Shape& local_shape,
                     const std::function<void(int64_t, int64_t, int64_t)>& fn);

struct ParamSpec {
  std::string name;  // unique in the model, e.g. "h.3.attn.c_attn.weight"
  Shape shape;
  Init init = Init::kNormal;
  float init_std = 0.02f;
  TensorSlice tp;  // the tensor-parallel slice this rank holds (default: the whole parameter)
  // Non-empty: this parameter IS the named parameter of an earlier layer (tied weights, e.g.
  // the LM head and the token embedding). It gets no storage of its own: the engine binds the
  // owner's parameter and gradient views, so gradients from both uses accumulate in one place.
  std::string tied_to;
  // Placed right after the previous parameter of the layer, with no alignment gap, so that a
  // run of packed parameters is one contiguous tensor in every buffer that mirrors the layer
  // (parameters, their 16-bit copies, gradients, gathered ZeRO-3 copies): q, k and v
  // projections computed by one GEMM (nn::Linear). The previous parameter must be one the
  // layer owns (not tied) and of the same trailing shape.
  bool packed = false;
  // False: frozen (a fine-tuned model's base, Note [Adapters and frozen parameters] in
  // nn/adapters.h). The engine keeps no gradient and no optimizer state for it, stores it in
  // the compute dtype, and binds an undefined gradient view, so a layer's backward skips it.
  bool trainable = true;
  // Set: a frozen weight kept quantized (QLoRA's base, Note [Quantized base] in
  // nn/adapters.h). The engine stores the blob of this piece (kernels/quant.h: LayoutOf(quant,
  // quant_geometry).total bytes, quantized from the whole weight) in place of its values and
  // binds a U8 view of it; the layer dequantizes it into the compute dtype before each GEMM.
  kernels::QuantFormat quant;
  kernels::QuantGeometry quant_geometry;
  bool quantized() const { return quant.type != kernels::QuantType::kNone; }
};

// The whole parameter's shape: the slice's full_shape when tensor parallelism splits it.
inline Shape FullShape(const ParamSpec& spec) {
  return spec.tp.split() ? spec.tp.full_shape : spec.shape;
}

// A layer's bound parameter and gradient views in the order of its Params(), for the modules
// a layer is made of (nn/modules.h). Index -1 is "none": an undefined Tensor.
struct ParamViews {
  std::span<const Tensor> params;
  std::span<const Tensor> grads;
  Tensor param(int i) const { return i < 0 ? Tensor() : params[static_cast<size_t>(i)]; }
  Tensor grad(int i) const { return i < 0 ? Tensor() : grads[static_cast<size_t>(i)]; }
};

// One micro-batch of token windows: tokens[b,t] and targets[b,t] = tokens[b,t+1].
struct MicroBatch {
  Tensor tokens;   // int32 [B,T]
  Tensor targets;  // int32 [B,T]; kIgnoreTarget where no loss is taken
  // Packed documents (Note [Packed documents], data/documents.h): int32 [B,T], each token's
  // position within its document (Hugging Face's position_ids); attention stays within a
  // document and RoPE turns by these positions. Undefined: one document per row, 0 .. T-1.
  // Under context parallelism (Note [Context parallelism], nn/context_parallel.h) always
  // defined: the global positions of this rank's piece of each sequence.
  Tensor positions = {};
  // Under context parallelism with packed documents: int32 [B, T x cp], the positions of the
  // whole sequences, which attention's mask needs. Undefined otherwise.
  Tensor whole_positions = {};
  int64_t B() const { return tokens.size(0); }
  int64_t T() const { return tokens.size(1); }
};

// One step of incremental decoding (Note [KV cache], nn/decoder.h): new positions
// first_position .. first_position + T - 1 of one sequence (batch 1), their tokens [1,T].
// Each transformer block keeps its keys and values in caches[BlockIndex()].
struct KvCache {
  // [capacity, kv width] fp32, rows 0 .. length - 1 filled; a sliding-window layer's are
  // [min(capacity, window), kv width] with position p in row p % rows (Note [Windowed KV cache]).
  Buffer k, v;
  int64_t length = 0;  // positions seen
};
struct DecodeStep {
  Tensor tokens;  // int32 [1,T]
  int64_t first_position = 0;
  int64_t capacity = 0;           // the longest sequence the caches must hold
  std::vector<KvCache>* caches;   // one per block
  Allocator* cache_allocator;     // where a block allocates its cache on first use
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string Name() const = 0;
  virtual std::vector<ParamSpec> Params() const = 0;
  // Shape of the output for this input shape (the first layer's input is the tokens [B,T]).
  virtual Shape OutputShape(const Shape& input_shape) const = 0;
  // The output's dtype when activations are `activations` (LayerContext::dtype): the same,
  // except for layers that output per-token losses, which are fp32.
  virtual DType OutputDType(DType activations) const { return activations; }
  virtual void Forward(const MicroBatch& mb, const Tensor& input, const Tensor& output,
                       LayerContext& ctx) = 0;
  // dinput is undefined (no data) for the first layer, whose input is token ids.
  virtual void Backward(const MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                        const Tensor& dinput, LayerContext& ctx) = 0;
  // The transformer block index (what activation_checkpointing.blocks names), -1 for other
  // layers. The engine may checkpoint a block: drop what its Forward saved and run Forward
  // again before Backward, so Forward must be deterministic.
  virtual int BlockIndex() const { return -1; }
  // Matmul FLOPs of forward per token at sequence length T (for FLOP/s and MFU reports).
  virtual double ForwardFlopsPerToken(int64_t /*seq_len*/) const { return 0.0; }
  // Fine-tuning (Note [Adapters and frozen parameters], nn/adapters.h): freezes the
  // parameters `plan` freezes and adds the LoRA adapters it asks for. BuildModel calls it
  // once, before anything reads Params(). The default leaves the layer as declared: a layer
  // of research code trains whole.
  virtual void Adapt(const AdapterPlan& /*plan*/) {}
  // Incremental decoding (Note [KV cache], nn/decoder.h): the forward of step.tokens' new
  // positions, fp32, batch 1, input and output [1,T,...] as Forward's, except the head's
  // output: fp32 logits [T, padded vocabulary] (DecodeOutputShape). The default throws: a
  // layer that cannot decode (research code's own) says so by name.
  virtual void Decode(const DecodeStep& step, const Tensor& input, const Tensor& output,
                      LayerContext& ctx);
  virtual Shape DecodeOutputShape(const Shape& input_shape) const {
    return OutputShape(input_shape);
  }

  // Called by the engine once storage exists; views are in the order of Params().
  void Bind(std::vector<Tensor> params, std::vector<Tensor> grads);
  bool bound() const { return !params_.empty() || Params().empty(); }

 protected:
  const Tensor& param(size_t i) const { return params_.at(i); }
  const Tensor& grad(size_t i) const { return grads_.at(i); }
  ParamViews views() const { return {params_, grads_}; }

 private:
  std::vector<Tensor> params_;
  std::vector<Tensor> grads_;
};

}  // namespace ztrain::nn
