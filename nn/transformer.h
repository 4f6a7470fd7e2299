#pragma once
// The three layers every family's model is made of, on the shared modules (nn/modules.h):
// Embedding (token table, optionally a learned position table), TransformerBlock (pre-norm:
// h = x + attention(norm1(x)), y = h + mlp(norm2(h))) and LmHead (final norm, the head tied
// to the token table or its own, and the fused loss). A family differs by the specs it gives
// (nn/gpt2.cc, nn/llama.cc), never by a class of its own; the parallel layout differs by the
// LinearProvider (Note [Linears handed to the builder]).
//
// Each layer holds a shared reference to its provider. Not thread safe, like every Layer.
#include <memory>
#include <string>
#include <vector>

#include "nn/layer.h"
#include "nn/linear_provider.h"
#include "nn/modules.h"

namespace ztrain::nn {

struct EmbeddingSpec {
  int64_t padded_vocab = 0, channels = 0, max_seq_len = 0;
  // Names come from the family's table (Note [Family name tables], nn/gpt2.h).
  std::string tokens;     // the token table's name
  std::string positions;  // the position table's name; empty: no position table
};

class Embedding final : public Layer {
 public:
  Embedding(const EmbeddingSpec& spec, std::shared_ptr<const LinearProvider> provider);
  std::string Name() const override { return "embedding"; }
  std::vector<ParamSpec> Params() const override { return table_.specs(); }
  Shape OutputShape(const Shape& tokens_shape) const override;
  void Forward(const MicroBatch& mb, const Tensor& input, const Tensor& output,
               LayerContext& ctx) override;
  void Backward(const MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                const Tensor& dinput, LayerContext& ctx) override;
  void Adapt(const AdapterPlan& plan) override;
  void Decode(const DecodeStep& step, const Tensor& input, const Tensor& output,
              LayerContext& ctx) override;

 private:
  std::shared_ptr<const LinearProvider> provider_;
  EmbeddingSpec spec_;
  ParamTable table_;
  int wte_ = -1, wpe_ = -1;
};

struct BlockSpec {
  std::string prefix;  // "h.3." (GPT-2), "layers.3." (Llama)
  int index = 0;
  int64_t channels = 0;
  NormSpec norm;
  std::string norm1, norm2;  // names
  AttentionSpec attention;
  MlpSpec mlp;
};

class TransformerBlock final : public Layer {
 public:
  TransformerBlock(const BlockSpec& spec, std::shared_ptr<const LinearProvider> provider);
  std::string Name() const override { return name_; }
  int BlockIndex() const override { return index_; }
  std::vector<ParamSpec> Params() const override { return table_.specs(); }
  Shape OutputShape(const Shape& input_shape) const override { return input_shape; }
  void Forward(const MicroBatch& mb, const Tensor& input, const Tensor& output,
               LayerContext& ctx) override;
  void Backward(const MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                const Tensor& dinput, LayerContext& ctx) override;
  // This piece's share (every matmul and the attention split over the provider's pieces).
  double ForwardFlopsPerToken(int64_t seq_len) const override;
  void Adapt(const AdapterPlan& plan) override;
  void Decode(const DecodeStep& step, const Tensor& input, const Tensor& output,
              LayerContext& ctx) override;

 private:
  std::shared_ptr<const LinearProvider> provider_;
  std::string name_;
  int index_;
  int64_t c_;
  ParamTable table_;
  Norm norm1_, norm2_;
  Attention attention_;
  Mlp mlp_;
};

struct HeadSpec {
  int64_t vocab = 0, padded_vocab = 0, channels = 0;
  NormSpec norm;
  std::string norm_name;  // names from the family's table
  std::string weight;
  std::string tied_to;  // the token table it shares; empty: a weight of its own
};

// The output is the per-token loss [B,T]; its backward takes d(objective)/d(loss) per token.
class LmHead final : public Layer {
 public:
  LmHead(const HeadSpec& spec, std::shared_ptr<const LinearProvider> provider);
  std::string Name() const override { return "lm_head"; }
  std::vector<ParamSpec> Params() const override { return table_.specs(); }
  Shape OutputShape(const Shape& input_shape) const override;
  DType OutputDType(DType) const override { return DType::kF32; }  // losses
  void Forward(const MicroBatch& mb, const Tensor& input, const Tensor& output,
               LayerContext& ctx) override;
  void Backward(const MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                const Tensor& dinput, LayerContext& ctx) override;
  double ForwardFlopsPerToken(int64_t seq_len) const override;
  void Adapt(const AdapterPlan& plan) override;
  // Decoding outputs the logits [T, padded vocab] (fp32) of the new positions.
  void Decode(const DecodeStep& step, const Tensor& input, const Tensor& output,
              LayerContext& ctx) override;
  Shape DecodeOutputShape(const Shape& input_shape) const override;

 private:
  std::shared_ptr<const LinearProvider> provider_;
  HeadSpec spec_;
  ParamTable table_;
  Norm norm_;
  int weight_ = -1;
  int64_t local_vocab_ = 0;
};

}  // namespace ztrain::nn
