#pragma once
// MegatronLinears: Megatron-style tensor parallelism (DESIGN.md "tensor parallel") as the
// LinearProvider a family's builder is handed (Note [Linears handed to the builder],
// nn/linear_provider.h): the shared layers of nn/transformer.h with their matrices split over
// the ranks of a tp group of size P. No layer of its own: the same block class runs whole or
// split.
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
// Parameters keep the single-process model's names and order; a split parameter's
// ParamSpec.shape is the rank's local shape and ParamSpec.tp says which slice of the whole it
// is (nn/layer.h), so initialisation and checkpoints can map local elements to whole ones.
//
// The provider holds a reference to the tp communicator, which must outlive it (and so every
// layer built on it), and Wait()s every collective it issues. Every rank of the group must run
// the same layers on the same micro-batch and the same input activation (replicated, as after
// the previous layer's all-reduce). The vocabulary loops run on the host: these computations
// need CPU ops (checked). They compute in the context's dtype, bf16 and fp16 included, with
// fp32 sums across the group (Note [Tensor parallelism in 16 bits], tp_common.h). An undefined
// parameter gradient (a frozen parameter) is skipped, the rest computed bit for bit as with it
// defined, the collectives unchanged (Note [Frozen parameters] in kernels/ops.h). Not thread
// safe, like every Layer.
#include <memory>

#include "core/config.h"
#include "nn/family.h"
#include "nn/linear_provider.h"
#include "parallel/comm/communicator.h"

namespace ztrain::tensor {

class MegatronLinears final : public nn::LinearProvider {
 public:
  // With `sequence_parallel`, Note [Sequence parallelism] (nn/linear_provider.h); `context`:
  // Note [Context parallelism] (nn/context_parallel.h).
  explicit MegatronLinears(comm::Communicator& tp, bool sequence_parallel = false,
                           std::shared_ptr<const nn::ContextGroup> context = nullptr)
      : LinearProvider(std::move(context)), tp_(tp), sequence_parallel_(sequence_parallel) {}
  int size() const override { return tp_.size(); }
  int rank() const override { return tp_.rank(); }
  bool sequence_parallel() const override { return sequence_parallel_; }
  // An all-gather over the tp group.
  void GatherRows(nn::LayerContext& ctx, const Tensor& local, const Tensor& whole) const override;
  // f's backward: the input gradients' partial sums are all-reduced (started before the
  // weight gradients are computed, so the two overlap), or reduce-scattered onto this rank's
  // rows under sequence parallelism.
  void ColumnBackward(nn::LayerContext& ctx, std::span<const nn::LinearGrad> linears,
                      const Tensor& x, const Tensor& dx) const override;
  // An all-reduce over the tp group.
  void SumOverPieces(nn::LayerContext& ctx, const Tensor& t) const override;
  // g: the partial sums are all-reduced in fp32 (reduce-scattered onto this rank's rows under
  // sequence parallelism), then bias and residual added once.
  void RowForward(nn::LayerContext& ctx, const Tensor& x, const Tensor& weight,
                  const Tensor& bias, const Tensor& residual, const Tensor& y) const override;
  // Each rank looks up the tokens of its vocabulary slice, one all-reduce assembles the rows
  // (megatron_embedding.cc); no collective in backward. Under sequence parallelism a
  // reduce-scatter leaves each rank its rows, and backward gathers their gradient.
  void EmbeddingForward(nn::LayerContext& ctx, const nn::MicroBatch& mb, const Tensor& wte,
                        const Tensor& wpe, const Tensor& out) const override;
  void EmbeddingBackward(nn::LayerContext& ctx, const nn::MicroBatch& mb, const Tensor& dout,
                         const Tensor& dwte, const Tensor& dwpe) const override;
  // The vocabulary-parallel cross-entropy (megatron_loss.cc): two all-reduces of per-token
  // numbers in forward, the input gradient's in backward.
  void HeadLossForward(nn::LayerContext& ctx, const nn::MicroBatch& mb, const Tensor& h,
                       const Tensor& weight, int64_t vocab, const Tensor& losses) const override;
  void HeadLossBackward(nn::LayerContext& ctx, const nn::MicroBatch& mb, const Tensor& h,
                        const Tensor& weight, int64_t vocab, const Tensor& dlosses,
                        const Tensor& dh, const Tensor& dweight) const override;

 private:
  void SequenceParallelEmbedding(nn::LayerContext& ctx, const nn::MicroBatch& mb, const Tensor& wte,
                                 const Tensor& wpe, const Tensor& output) const;

  comm::Communicator& tp_;
  bool sequence_parallel_;
};

// The provider for a tp group: MegatronLinears, or nn::WholeLinears for a group of one
// (sequence parallelism is nothing then); attention's context-parallel exchanges over `cp`
// when it is given and larger than one rank.
std::shared_ptr<const nn::LinearProvider> MakeLinears(
    comm::Communicator& tp, bool sequence_parallel = false, comm::Communicator* cp = nullptr,
    nn::ContextAlgorithm algorithm = nn::ContextAlgorithm::kUlysses);

// `model` built over the tp group (nn::BuildModel with MakeLinears(tp)): the single-process
// model's layers, names and order, each parameter the rank's slice, adapted as `plan` says;
// with `sequence_parallel`, Note [Sequence parallelism]; with a cp group, Note [Context
// parallelism].
nn::LayerList BuildParallelModel(const ModelConfig& model, comm::Communicator& tp,
                                 const nn::AdapterPlan& plan = nn::AdapterPlan(),
                                 bool sequence_parallel = false, comm::Communicator* cp = nullptr,
                                 nn::ContextAlgorithm algorithm = nn::ContextAlgorithm::kUlysses);

}  // namespace ztrain::tensor
