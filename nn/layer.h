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
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/layer_context.h"

namespace ztrain::nn {

enum class Init { kZeros, kOnes, kNormal };

// How tensor parallelism will split a parameter (used from the tensor-parallel issue on).
enum class TensorSplit { kNone, kColumn, kRow, kVocab };

struct ParamSpec {
  std::string name;  // unique in the model, e.g. "h.3.attn.c_attn.weight"
  Shape shape;
  Init init = Init::kNormal;
  float init_std = 0.02f;
  bool weight_decay = true;
  TensorSplit split = TensorSplit::kNone;
  // Non-empty: this parameter IS the named parameter of an earlier layer (tied weights, e.g.
  // the LM head and the token embedding). It gets no storage of its own: the engine binds the
  // owner's parameter and gradient views, so gradients from both uses accumulate in one place.
  std::string tied_to;
};

// One micro-batch of token windows: tokens[b,t] and targets[b,t] = tokens[b,t+1].
struct MicroBatch {
  Tensor tokens;   // int32 [B,T]
  Tensor targets;  // int32 [B,T]
  int64_t B() const { return tokens.size(0); }
  int64_t T() const { return tokens.size(1); }
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string Name() const = 0;
  virtual std::vector<ParamSpec> Params() const = 0;
  // Shape of the output for this input shape (the first layer's input is the tokens [B,T]).
  virtual Shape OutputShape(const Shape& input_shape) const = 0;
  virtual void Forward(const MicroBatch& mb, const Tensor& input, const Tensor& output,
                       LayerContext& ctx) = 0;
  // dinput is undefined (no data) for the first layer, whose input is token ids.
  virtual void Backward(const MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                        const Tensor& dinput, LayerContext& ctx) = 0;
  // Matmul FLOPs of forward per token at sequence length T (for FLOP/s and MFU reports).
  virtual double ForwardFlopsPerToken(int64_t /*seq_len*/) const { return 0.0; }

  // Called by the engine once storage exists; views are in the order of Params().
  void Bind(std::vector<Tensor> params, std::vector<Tensor> grads);
  bool bound() const { return !params_.empty() || Params().empty(); }

 protected:
  const Tensor& param(size_t i) const { return params_.at(i); }
  const Tensor& grad(size_t i) const { return grads_.at(i); }

 private:
  std::vector<Tensor> params_;
  std::vector<Tensor> grads_;
};

}  // namespace ztrain::nn
