#pragma once
// LinearProvider: how a model's linears, token embedding and LM head compute — whole, on one
// process (WholeLinears), or split over a tensor-parallel group (tensor::MegatronLinears,
// parallel/tensor/megatron_linears.h). A family's builder hands one to the shared modules
// (nn/modules.h), so one block class serves every layout (DESIGN.md "Model families").
//
// Note [Linears handed to the builder]
// Megatron's split, in the words the modules use:
//   column-parallel linear: weight rows split; each piece computes its slice of the output
//     features from the whole input. Its backward sums the input gradient over the pieces
//     (Megatron's f).
//   row-parallel linear: weight columns split; each piece consumes its slice of the input
//     features. The output is the sum over the pieces, then the bias and the residual are
//     added once (Megatron's g). Its backward needs nothing from the group: the output
//     gradient is whole on every piece and each piece's input gradient is its own slice.
//   vocabulary-parallel embedding and LM head: rows of the table split; the loss is computed
//     without gathering the logits.
// A module declares a split parameter with its whole shape and asks the provider for its
// local spec (Column, Row, VocabRows): shape becomes this piece's, ParamSpec::tp says which
// slice of the whole it holds (nn/layer.h). With one piece every spec stays whole and every
// computation is the single-process op sequence, bit for bit.
//
// Note [Sequence parallelism]
// Megatron's sequence parallelism (Korthikanti et al. 2022), on a provider built with it: the
// parts of a block outside the linear pairs (the norms, the residual stream, what flows
// between layers and pipeline stages) hold only this piece's share of the tokens instead of
// all of them on every piece. The N = B x T token rows of a micro-batch are cut into P
// contiguous chunks of N / P rows (T % P == 0); piece p holds rows [p N/P, (p+1) N/P), as an
// activation of shape [B, T/P, C] (a count of rows: the chunk is of the flattened rows, not of
// each sample). A block then gathers the normed rows before each column-parallel linear
// (GatherRows: an all-gather in forward, whose backward is the reduce-scatter of the input
// gradient in ColumnBackward) and a row-parallel linear's partial sums are reduce-scattered
// onto the pieces' rows (RowForward, in place of the all-reduce; its backward gathers the
// output gradient). The same bytes cross the group as with the all-reduces (an all-reduce is
// a reduce-scatter then an all-gather), while the norms' and residual's activations and
// their work fall by P. A norm's weight now sees only the piece's rows, so its gradient is
// summed over the pieces (Norm::Backward with the provider); the embedding reduce-scatters
// its vocabulary slices' rows, and the LM head gathers the final norm's rows. RowForward and
// ColumnBackward tell the two cases apart by shape: an output (or dx) of N / P rows for an
// input of N is a piece's share, so generation, which does not split the tokens, runs the
// all-reduce path on the same provider.

// Every parameter gradient handed to a provider may be an undefined Tensor (a frozen
// parameter): the provider skips it, writes nothing there, and computes everything else bit
// for bit as with it defined, as the ops do (Note [Frozen parameters] in kernels/ops.h).
//
// Providers are shared by the layers of one model (std::shared_ptr) and must be used by one
// thread at a time, as layers are. Errors: ztrain::Error from the ops; a Megatron provider's
// collectives fail as its communicator's do.
#include <memory>
#include <span>

#include "core/buffer.h"
#include "nn/context_parallel.h"
#include "nn/layer.h"
#include "nn/layer_context.h"

namespace ztrain::nn {

// One linear of several that read the same input x (SwiGLU's gate and up): its output
// gradient, weight, and gradients.
struct LinearGrad {
  Tensor dy;
  Tensor weight;
  Tensor dweight;  // undefined for a frozen weight
  Tensor dbias;    // undefined without a bias, or for a frozen one
  Buffer hold;     // what `weight` lies in when it was dequantized for this backward
};

class LinearProvider {
 public:
  // `context`: the group each sequence is split over (Note [Context parallelism],
  // nn/context_parallel.h), or null.
  explicit LinearProvider(std::shared_ptr<const ContextGroup> context = nullptr)
      : context_(std::move(context)) {}
  virtual ~LinearProvider() = default;
  // The context-parallel group attention exchanges heads over, or null (no context
  // parallelism, or a group of one).
  const ContextGroup* context() const {
    return context_ != nullptr && context_->size() > 1 ? context_.get() : nullptr;
  }
  // Pieces every split parameter is cut into, and this process's piece.
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // Note [Sequence parallelism]: whether the token rows between the linears are split over
  // the pieces, and the whole rows [N, C] from this piece's [N/P, C] (an all-gather; `whole`
  // may be any float dtype of `local`'s).
  virtual bool sequence_parallel() const { return false; }
  virtual void GatherRows(LayerContext& ctx, const Tensor& local, const Tensor& whole) const;

  // The local spec of a column-parallel weight [out, in] or bias [out] (rows of `groups`
  // equal blocks split piece by piece: a fused q/k/v weight is 3 blocks), of a row-parallel
  // weight [out, in] (columns split), of a vocabulary-split table [rows, C].
  ParamSpec Column(ParamSpec whole, int groups = 1) const;
  ParamSpec Row(ParamSpec whole) const;
  ParamSpec VocabRows(ParamSpec whole) const { return Column(std::move(whole)); }

  // Backward of column-parallel linears that read the same whole input x:
  // dx = sum over the linears (and the pieces) of dy @ weight, overwritten; each dweight +=
  // dy^T x and dbias += the column sums of dy, each skipped when undefined (frozen). A dx of
  // N / P rows for x's N is this piece's rows of the sum (Note [Sequence parallelism]).
  virtual void ColumnBackward(LayerContext& ctx, std::span<const LinearGrad> linears,
                              const Tensor& x, const Tensor& dx) const = 0;
  // t (fp32), a partial sum on each piece, summed over the pieces in place (LoRA's
  // adapters, Note [LoRA in the linears]); nothing to do with one piece.
  virtual void SumOverPieces(LayerContext& ctx, const Tensor& t) const = 0;
  // Forward of a row-parallel linear: y = residual + (x @ weight^T summed over the pieces) +
  // bias (bias may be undefined). y may be neither x nor residual. A y (and residual) of
  // N / P rows for x's N is this piece's rows of it (Note [Sequence parallelism]).
  virtual void RowForward(LayerContext& ctx, const Tensor& x, const Tensor& weight,
                          const Tensor& bias, const Tensor& residual, const Tensor& y) const = 0;

  // out[B,T,C] = wte[tokens] (+ wpe[t] when wpe is defined, wpe[mb.positions[b][t]] for packed
  // documents: PositionRows); wte is this piece's rows.
  virtual void EmbeddingForward(LayerContext& ctx, const MicroBatch& mb, const Tensor& wte,
                                const Tensor& wpe, const Tensor& out) const = 0;
  // dwte (this piece's rows) and dwpe accumulate from dout, each when defined (an undefined
  // one: frozen, or no position table).
  virtual void EmbeddingBackward(LayerContext& ctx, const MicroBatch& mb, const Tensor& dout,
                                 const Tensor& dwte, const Tensor& dwpe) const = 0;

  // The LM head and its loss: logits = h[N,C] @ weight^T over this piece's rows of the padded
  // vocabulary (saved in ctx as "logits"), losses[N] = the cross-entropy of each row's target
  // over the real vocabulary [0, vocab).
  virtual void HeadLossForward(LayerContext& ctx, const MicroBatch& mb, const Tensor& h,
                               const Tensor& weight, int64_t vocab,
                               const Tensor& losses) const = 0;
  // dh[N,C] (overwritten) and dweight (accumulated; skipped when undefined: frozen) from
  // dlosses[N] (fp32); the saved logits are turned into their gradient in place.
  virtual void HeadLossBackward(LayerContext& ctx, const MicroBatch& mb, const Tensor& h,
                                const Tensor& weight, int64_t vocab, const Tensor& dlosses,
                                const Tensor& dh, const Tensor& dweight) const = 0;

 private:
  std::shared_ptr<const ContextGroup> context_;
};

// The single-process provider: every parameter whole, every computation the plain op.
class WholeLinears final : public LinearProvider {
 public:
  using LinearProvider::LinearProvider;
  int size() const override { return 1; }
  int rank() const override { return 0; }
  void ColumnBackward(LayerContext& ctx, std::span<const LinearGrad> linears, const Tensor& x,
                      const Tensor& dx) const override;
  void SumOverPieces(LayerContext&, const Tensor&) const override {}
  void RowForward(LayerContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& residual, const Tensor& y) const override;
  void EmbeddingForward(LayerContext& ctx, const MicroBatch& mb, const Tensor& wte,
                        const Tensor& wpe, const Tensor& out) const override;
  void EmbeddingBackward(LayerContext& ctx, const MicroBatch& mb, const Tensor& dout,
                         const Tensor& dwte, const Tensor& dwpe) const override;
  void HeadLossForward(LayerContext& ctx, const MicroBatch& mb, const Tensor& h,
                       const Tensor& weight, int64_t vocab, const Tensor& losses) const override;
  void HeadLossBackward(LayerContext& ctx, const MicroBatch& mb, const Tensor& h,
                        const Tensor& weight, int64_t vocab, const Tensor& dlosses,
                        const Tensor& dh, const Tensor& dweight) const override;
};

// Packed documents (Note [Packed documents], data/documents.h): the position table's rows at
// each token's document position, wpe[mb.positions[b][t]], fp32 [B,T,C] scratch of ctx; and
// their gradient into dwpe (skipped when undefined). Deterministic.
Tensor PositionRows(LayerContext& ctx, const MicroBatch& mb, const Tensor& wpe);
void PositionRowsBackward(LayerContext& ctx, const MicroBatch& mb, const Tensor& dout,
                          const Tensor& dwpe);

// A shared WholeLinears, with the context-parallel group when there is one.
std::shared_ptr<const LinearProvider> MakeWholeLinears(
    std::shared_ptr<const ContextGroup> context = nullptr);

}  // namespace ztrain::nn
