#pragma once
// The GPT-2 model family as a sequence of layers: Embedding, N x TransformerBlock, LmHead
// (final layernorm + LM head tied to the token embedding + softmax cross-entropy).
//
// Parameter names follow Hugging Face's GPT-2 without the "transformer." prefix ("wte",
// "h.3.attn.c_attn.weight", "ln_f.bias") so exports and llm.c's file order map by name.
// Linear weights are stored [out, in] as llm.c stores them. GPT-2 initialisation: normal
// std 0.02, residual projections (attn.c_proj, mlp.c_proj) 0.02/sqrt(2*n_layer), biases 0,
// layernorm weights 1. Weight decay applies to matrices and embeddings, not to biases or
// layernorm parameters (Megatron's and nanoGPT's grouping).
#include <memory>
#include <vector>

#include "core/config.h"
#include "nn/layer.h"

namespace ztrain::nn {

class Embedding final : public Layer {
 public:
  Embedding(int64_t padded_vocab, int64_t max_seq_len, int64_t channels);
  std::string Name() const override { return "embedding"; }
  std::vector<ParamSpec> Params() const override;
  Shape OutputShape(const Shape& tokens_shape) const override;
  void Forward(const MicroBatch& mb, const Tensor& input, const Tensor& output,
               LayerContext& ctx) override;
  void Backward(const MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                const Tensor& dinput, LayerContext& ctx) override;

 private:
  int64_t vp_, max_t_, c_;
};

class TransformerBlock final : public Layer {
 public:
  TransformerBlock(int index, int n_layer, int64_t channels, int n_head);
  std::string Name() const override { return prefix_.substr(0, prefix_.size() - 1); }
  int BlockIndex() const override { return std::stoi(prefix_.substr(2)); }  // "h.<index>."
  std::vector<ParamSpec> Params() const override;
  Shape OutputShape(const Shape& input_shape) const override { return input_shape; }
  void Forward(const MicroBatch& mb, const Tensor& input, const Tensor& output,
               LayerContext& ctx) override;
  void Backward(const MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                const Tensor& dinput, LayerContext& ctx) override;
  double ForwardFlopsPerToken(int64_t seq_len) const override;

 private:
  std::string prefix_;  // "h.<index>."
  int n_layer_;
  int64_t c_;
  int nh_;
};

// Final layernorm, LM head tied to "wte", and the loss: the output is the per-token loss
// [B,T]; its backward takes d(objective)/d(loss) per token.
class LmHead final : public Layer {
 public:
  LmHead(int64_t vocab, int64_t padded_vocab, int64_t channels);
  std::string Name() const override { return "lm_head"; }
  std::vector<ParamSpec> Params() const override;
  Shape OutputShape(const Shape& input_shape) const override;
  DType OutputDType(DType) const override { return DType::kF32; }  // losses
  void Forward(const MicroBatch& mb, const Tensor& input, const Tensor& output,
               LayerContext& ctx) override;
  void Backward(const MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                const Tensor& dinput, LayerContext& ctx) override;
  double ForwardFlopsPerToken(int64_t seq_len) const override;

 private:
  int64_t v_, vp_, c_;
};

std::vector<std::unique_ptr<Layer>> BuildGpt2(const ModelConfig& model);

}  // namespace ztrain::nn
