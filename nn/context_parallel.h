#pragma once
// Context parallelism: each sequence of a micro-batch split over the ranks of a cp group.
//
// Note [Context parallelism]
// Megatron's context parallelism (`--context-parallel-size`) with DeepSpeed-Ulysses' exchange
// (Megatron's `--cp-comm-type a2a`). The P ranks of a cp group read the same samples (their
// data-parallel index is the same) and rank r keeps tokens [r T/P, (r+1) T/P) of every sample
// of length T: its micro-batch is [B, T/P] (ContextSlice), through the whole model, and each
// token keeps its global position (MicroBatch::positions: RoPE turns by it, GPT-2's table is
// read at it; with packed documents the document positions of the whole sequence, Note
// [Packed documents] in data/documents.h). Everything but attention acts on each token by
// itself, so it runs unchanged on the slice. Attention (nn::Attention) needs every key of the
// sequence: after the q/k/v projection and RoPE, an all-to-all over the group turns
// [B, T/P, all heads] into [B, T, heads/P] (ContextGroup::SequenceToHeads: rank j gets the
// j-th group of NH/P query heads and the key/value heads they read; with fewer key/value
// heads than P, each is replicated to the P/NKV ranks whose query heads share it), the
// single-process kernel attends over the whole sequence with the whole sequence's mask
// (causal, window, documents: MicroBatch::whole_positions), and a second all-to-all turns the
// output back (HeadsToSequence). The backward mirrors the two exchanges; a replicated
// key/value head's gradient is the sum of its copies' (added as they come home).
//
// The loss is the whole sequence's: each rank's mean over its T/P targets weighs 1/(m dp P)
// and the gradients are reduced over the dp x cp group (the engine's data-parallel group is
// that group: ProcessGrid, GridCommunicators::gradients()); with packed documents the real
// targets are counted over it (Note [Loss over real targets] in engine/engine_step.cc). ZeRO
// shards over the same dp x cp ranks, as Megatron's distributed optimizer does.
//
// Per layer and micro-batch each rank sends (P-1)/P of its q/k/v and of its attention output
// in forward, the same of their gradients in backward. A ContextGroup must be used by one
// thread at a time, as layers are; its collectives fail as its communicator's do.
//
// Note [Ring attention]
// The other algorithm (Megatron's `--cp-comm-type p2p`, zhuzilin/ring-flash-attention's zigzag):
// the sequence is cut into 2P chunks of c = T/(2P) tokens and rank r keeps chunks r and
// 2P-1-r of every sample (ContextSlice), so that under the causal mask every rank has the same
// work. Attention keeps every head; the keys and values travel the ring instead: at step s
// (0 .. P-1) rank r holds those of rank r - s, sends them on to r + 1 while it computes
// (StartShift), and attends each of its query chunks X over each held key chunk Y that lies
// before it (Y = X on the diagonal, causal): the single-process kernel on the pair's rows, the
// queries of X beside the keys and values of Y, with the mask's offset (kernels::AttentionMask:
// X's row i is at Y's key index i + (X - Y) c, its window and document counted back from
// there, by X's rows' document positions). Each pair's output and log-sum-exp are merged into
// the chunk's running ones in fp32 (Ops::MergeAttention). The backward runs the ring again with
// the final output and log-sum-exp: each pair's kernel backward adds to the chunk's dq (fp32)
// and to the dk/dv of the key chunk, which travel with the keys (fp32) and come home after the
// last step. Only the rank's own q/k/v, output and log-sum-exp are saved; the others' keys
// come again in backward. Any head count works; T must divide by 2P.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "nn/layer.h"
#include "nn/layer_context.h"

namespace ztrain::nn {

// Which columns of a rank's whole-head row [NH + 2 NKV heads] go to (or come from) head group
// `j`, and where they sit in the group's row [NH/P + 2 kvh heads].
struct HeadColumns {
  int64_t local = 0;  // first column in the whole-head row
  int64_t group = 0;  // first column in the head group's row
  int64_t width = 0;
  bool operator==(const HeadColumns&) const = default;
};

// The head groups of Ulysses over `size` ranks for `heads` (this tensor-parallel piece's).
class UlyssesHeads {
 public:
  UlyssesHeads(const kernels::AttentionHeads& heads, int size);
  // Rank j's heads: NH/P query heads, and NKV/P key/value heads or the one they share.
  const kernels::AttentionHeads& group() const { return group_; }
  // Rank j's columns of q, k and v (`with_kv` false: of q only, an attention output's).
  std::vector<HeadColumns> Columns(int j, bool with_kv) const;

 private:
  kernels::AttentionHeads whole_, group_;
};

enum class ContextAlgorithm {
  kUlysses,  // all-to-all of heads (Note [Context parallelism])
  kRing,     // keys and values around a ring, zigzag chunks (Note [Ring attention])
};
// "ulysses" or "ring" (context_parallel.algorithm); throws ConfigError otherwise.
ContextAlgorithm ParseContextAlgorithm(const std::string& name);

// The collective a context-parallel layout runs attention with: the cp group.
class ContextGroup {
 public:
  explicit ContextGroup(ContextAlgorithm algorithm = ContextAlgorithm::kUlysses)
      : algorithm_(algorithm) {}
  virtual ~ContextGroup() = default;
  ContextAlgorithm algorithm() const { return algorithm_; }
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // `in` and `out` hold size() equal chunks: chunk j of `in` goes to rank j, where it becomes
  // chunk rank() of `out` (comm::Communicator::AllToAll). Waits for it.
  virtual void AllToAll(const Tensor& in, const Tensor& out) const = 0;

  // local [B*T/P, W] (this rank's tokens, all of its heads) -> group [B*T, Wg] (the whole
  // sequence, rank()'s head group: UlyssesHeads::Columns; `with_kv` false: q only).
  void SequenceToHeads(LayerContext& ctx, const UlyssesHeads& heads, bool with_kv, int64_t batch,
                       const Tensor& local, const Tensor& group) const;
  // The inverse: group [B*T, Wg] -> local [B*T/P, W], overwritten; columns that several groups
  // send (a replicated key/value head's gradient) are summed.
  void HeadsToSequence(LayerContext& ctx, const UlyssesHeads& heads, bool with_kv, int64_t batch,
                       const Tensor& group, const Tensor& local) const;

  // Note [Ring attention]. Starts sending `send` to rank() + 1 and receiving `recv` (the same
  // shape and dtype) from rank() - 1, around the group; the returned function waits for both.
  virtual std::function<void()> StartShift(const Tensor& send, const Tensor& recv) const = 0;
  // Attention of this rank's chunks: qkv [B*T/P, W] (its two chunks of each sample, after RoPE;
  // `heads` this tensor-parallel piece's) -> out [B*T/P, NH*HS] and lse (fp32, B*2*NH*c
  // elements in the ring's own layout, for RingBackward). `positions`: with packed documents
  // this rank's rows' document positions [B, T/P], else undefined; `window` the sliding window.
  void RingForward(LayerContext& ctx, const kernels::AttentionHeads& heads, int64_t window,
                   const Tensor& positions, int64_t batch, const Tensor& qkv, const Tensor& out,
                   const Tensor& lse) const;
  // dqkv [B*T/P, W] (overwritten) from dout and Forward's qkv, out and lse.
  void RingBackward(LayerContext& ctx, const kernels::AttentionHeads& heads, int64_t window,
                    const Tensor& positions, int64_t batch, const Tensor& dout, const Tensor& qkv,
                    const Tensor& out, const Tensor& lse, const Tensor& dqkv) const;

 private:
  ContextAlgorithm algorithm_;
};

// Rank `rank` of `size`'s piece of each of `rows` sequences of `seq` tokens (row-major
// [rows, seq] arrays): tokens and targets [rows, seq/size], and positions, the pieces' global
// ones (`whole_positions`' when given, packed documents', else t). Ulysses' piece is tokens
// [rank seq/size, (rank+1) seq/size); the ring's is chunks rank and 2 size - 1 - rank of
// seq / (2 size) tokens (Note [Ring attention]). `seq` divides by size (ring: 2 size).
void ContextSlice(ContextAlgorithm algorithm, int rank, int size, int64_t rows, int64_t seq,
                  const int32_t* tokens, const int32_t* targets, const int32_t* whole_positions,
                  int32_t* slice_tokens, int32_t* slice_targets, int32_t* slice_positions);

// A micro-batch's pieces under context parallelism, with the storage they live in.
struct ContextMicroBatch {
  std::vector<int32_t> tokens, targets, positions, whole_positions;
  MicroBatch mb;
  // `whole`'s piece for rank `rank` of `size` (whole.positions, when defined, are packed
  // documents': kept whole in mb.whole_positions for the attention mask).
  ContextMicroBatch(const MicroBatch& whole, int rank, int size,
                    ContextAlgorithm algorithm = ContextAlgorithm::kUlysses);
  ContextMicroBatch(const ContextMicroBatch&) = delete;
  ContextMicroBatch& operator=(const ContextMicroBatch&) = delete;
};

}  // namespace ztrain::nn
