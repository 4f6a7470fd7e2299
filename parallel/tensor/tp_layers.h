#pragma once
// Megatron-style tensor parallelism for GPT-2 (DESIGN.md "tensor parallel"): the layers of
// nn/gpt2.h with their matrices split over the ranks of a tp group of size P.
//
// Note [Megatron f and g]
// A transformer block pairs a column-parallel linear (weight rows split: each rank computes
// its slice of the output features) with a row-parallel one (weight columns split: each rank
// consumes its slice of the input features and produces a partial sum of the whole output).
// Between the two nothing crosses ranks: the attention heads and the MLP's GELU act on each
// rank's own features. Megatron names the two conjugate operators around the pair:
//   f: identity in forward, all-reduce (sum) of the input gradient in backward. It sits
//      before each column-parallel linear, whose input (a layernorm output) every rank holds
//      whole, and whose input gradient is a partial sum on each rank.
//   g: all-reduce (sum) in forward, identity in backward. It sits after each row-parallel
//      linear and turns the partial sums into the whole output.
// So a block does exactly two all-reduces in forward (attn.c_proj, mlp.c_proj) and two in
// backward (the inputs of attn.c_attn and mlp.c_fc). Everything outside the pairs (the
// residual stream, layernorms, the row-parallel biases) is replicated: each rank computes
// the same values, and the gradients of replicated parameters come out equal on every rank,
// so they need no tp reduction. A row-parallel bias is added once, after the all-reduce.
// The backward all-reduce of f is started before the weight gradient is computed, so the two
// overlap.
//
// The vocabulary is split the same way: the embedding table and the tied LM head hold rows
// [p*Vp/P, (p+1)*Vp/P) on tp rank p. The embedding looks up the tokens it owns and
// all-reduces; the loss is a vocabulary-parallel cross-entropy that never gathers the
// logits (three numbers per token cross ranks: the max, the sum of exp and the target logit).
//
// Parameters keep nn::BuildGpt2's names and order; a split parameter's ParamSpec.shape is the
// rank's local shape and ParamSpec.tp says which slice of the whole it is (nn/layer.h), so
// initialisation and checkpoints can map local elements to whole ones.
//
// Each layer holds a reference to the tp communicator, which must outlive it, and Wait()s
// every collective it issues inside Forward/Backward. Every rank of the group must run the
// same layers on the same micro-batch and the same input activation (replicated, as after
// the previous layer's all-reduce). The vocabulary loops run on the host: these layers need
// CPU ops (checked). They compute in the context's dtype, bf16 and fp16 included, with fp32
// sums across the group (Note [Tensor parallelism in 16 bits], tp_common.h). Not thread
// safe, like every Layer.
#include <memory>
#include <vector>

#include "core/config.h"
#include "nn/layer.h"
#include "parallel/comm/communicator.h"

namespace ztrain::tensor {

// Token embedding split over the vocabulary ("wte" [Vp/P, C], dim 0) and the whole position
// embedding ("wpe"). Forward: one all-reduce of the output; backward: none.
class VocabParallelEmbedding final : public nn::Layer {
 public:
  VocabParallelEmbedding(int64_t padded_vocab, int64_t max_seq_len, int64_t channels,
                         comm::Communicator& tp);
  std::string Name() const override { return "embedding"; }
  std::vector<nn::ParamSpec> Params() const override;
  Shape OutputShape(const Shape& tokens_shape) const override;
  void Forward(const nn::MicroBatch& mb, const Tensor& input, const Tensor& output,
               nn::LayerContext& ctx) override;
  void Backward(const nn::MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                const Tensor& dinput, nn::LayerContext& ctx) override;

 private:
  comm::Communicator& tp_;
  int64_t vp_, max_t_, c_;
  int64_t vocab_begin_, local_vocab_;  // this rank's rows of the whole table
};

// A GPT-2 block over n_head/P heads and 4C/P MLP features: c_attn and c_fc column-parallel,
// both c_proj row-parallel (Note [Megatron f and g]). Two all-reduces forward, two backward.
class ParallelTransformerBlock final : public nn::Layer {
 public:
  ParallelTransformerBlock(int index, int n_layer, int64_t channels, int n_head,
                           comm::Communicator& tp);
  std::string Name() const override { return prefix_.substr(0, prefix_.size() - 1); }
  int BlockIndex() const override { return std::stoi(prefix_.substr(2)); }  // "h.<index>."
  std::vector<nn::ParamSpec> Params() const override;
  Shape OutputShape(const Shape& input_shape) const override { return input_shape; }
  void Forward(const nn::MicroBatch& mb, const Tensor& input, const Tensor& output,
               nn::LayerContext& ctx) override;
  void Backward(const nn::MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                const Tensor& dinput, nn::LayerContext& ctx) override;
  // This rank's share: every matmul and the attention are split, so 1/P of the whole block.
  double ForwardFlopsPerToken(int64_t seq_len) const override;

 private:
  comm::Communicator& tp_;
  std::string prefix_;  // "h.<index>."
  int n_layer_;
  int64_t c_;
  int nh_;      // heads of the whole block
  int64_t cl_;  // attention features on this rank: C/P
  int nhl_;     // heads on this rank: n_head/P
};

// Final layernorm, LM head tied to "wte" with the same vocabulary slice, and the
// vocabulary-parallel cross-entropy. The output is the per-token loss [B,T], equal on every
// rank. Forward: two all-reduces of per-token numbers (a max, then the sum of exp and the
// target logit together); backward: one all-reduce of the input gradient.
class VocabParallelLmHead final : public nn::Layer {
 public:
  VocabParallelLmHead(int64_t vocab, int64_t padded_vocab, int64_t channels,
                      comm::Communicator& tp);
  std::string Name() const override { return "lm_head"; }
  std::vector<nn::ParamSpec> Params() const override;
  Shape OutputShape(const Shape& input_shape) const override;
  DType OutputDType(DType) const override { return DType::kF32; }  // losses
  void Forward(const nn::MicroBatch& mb, const Tensor& input, const Tensor& output,
               nn::LayerContext& ctx) override;
  void Backward(const nn::MicroBatch& mb, const Tensor& input, const Tensor& doutput,
                const Tensor& dinput, nn::LayerContext& ctx) override;
  double ForwardFlopsPerToken(int64_t seq_len) const override;

 private:
  comm::Communicator& tp_;
  int64_t v_, vp_, c_;
  int64_t vocab_begin_, local_vocab_;  // this rank's rows of the whole table
  int64_t local_real_;                 // of those, the real (< v_) ones: a prefix
};

// Throws ConfigError listing every way `model` cannot be split over `tp_size` ranks (heads,
// channels or padded vocabulary not divisible), each with the fix. Collective-free.
void CheckTensorParallelModel(const ModelConfig& model, int tp_size);

// GPT-2 split over the tp group: the layers of nn::BuildGpt2, in its order and with its
// parameter names. A group of one gets nn::BuildGpt2's layers themselves.
std::vector<std::unique_ptr<nn::Layer>> BuildParallelGpt2(const ModelConfig& model,
                                                          comm::Communicator& tp);

}  // namespace ztrain::tensor
