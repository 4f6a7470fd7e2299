#pragma once
// The op set: every computation a GPT-style model needs, forward and backward, behind one
// interface so that a CUDA implementation can sit beside the CPU one (DESIGN.md "kernels").
//
// Conventions, shared by every implementation:
// - Tensors are contiguous row-major views on the Ops' device. Shapes are checked and a
//   mismatch throws ztrain::Error naming the argument.
// - B = batch, T = sequence, C = channels, NH = heads, N = B*T rows, V = real vocabulary,
//   Vp = padded vocabulary (>= V). Linear weights are [OC, C] (out, in), as llm.c and PyTorch
//   nn.Linear store them.
// - Forward ops overwrite their outputs.
// - Backward ops ACCUMULATE (+=) into parameter gradients (dweight, dbias, dwte, dwpe), so
//   micro-batches and tied weights sum naturally, and OVERWRITE input gradients (dx, dqkv),
//   unless the comment says otherwise. Every parameter gradient may be an undefined Tensor
//   (Note [Frozen parameters]).
// - Dtypes (Note [16-bit tensors]): every floating-point tensor argument may be fp32, bf16 or
//   fp16, independently of the others, except the ones fixed as fp32: LayerNorm's mean and
//   rstd, RMSNorm's rstd, attention's lse, RoPE's inv_freq, AddBiasAndResidual's sum, the
//   cross-entropies' losses and dlosses, and the vocabulary-parallel one's stats. (Their
//   logits may be 16-bit; the dlogits written over them in place are then 16-bit too.)
//   tokens and targets are int32. A backend may implement a subset and says which in its
//   header: CpuOps and CudaOps take every combination (kernels/cpu/widen.h,
//   kernels/cuda/widen.h).
// - Ops may run multi-threaded internally; an Ops object is used by one thread at a time.
// - Ops may run asynchronously (CUDA: enqueued on the object's stream, in issue order):
//   results reach the host only through Copy followed by Synchronize, or SumSquares.
//
// Note [16-bit tensors]: arithmetic is fp32 whatever the dtypes. 16-bit inputs are widened
// exactly; each 16-bit output is rounded once, to nearest even, when it is stored. Accumulated
// outputs (dweight, dbias, dwte, dwpe, AddInPlace's and AddColumns' y, Gemm's c when
// beta != 0) are read, added to in fp32 and rounded once. So an op on 16-bit tensors gives the
// fp32 op's result on the same (widened) values, rounded to each output's dtype; on the CPU bit
// for bit, except GEMMs on two bf16 operands, which run on bf16 hardware through oneDNN with fp32
// accumulation in another summation order (each product of two bf16 values is exact in fp32).
// GEMMs with an fp16 operand run in fp32: the CPUs we target have no AMX-FP16 or AVX512-FP16
// dot products, so fp16 hardware GEMMs would gain nothing there. The determinism stated below
// (EmbeddingBackward, the CPU backend's reductions) holds for every dtype.
//
// Note [Frozen parameters]: a parameter that is not trained (the base weights under LoRA
// fine-tuning) has no gradient buffer, and its layer passes an undefined Tensor (Tensor(),
// defined() false) where the parameter's gradient would go. Every backward op skips the
// accumulation into an undefined parameter gradient, writes nothing for it, and computes
// everything else (the input gradient, the other parameters' gradients) bit for bit as it
// would with the gradient defined. The linear providers (nn/linear_provider.h) and the
// tensor-parallel ones (parallel/tensor/megatron_linears.h) keep the same contract.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "core/loss_target.h"
#include "core/tensor.h"
#include "kernels/dropout.h"
#include "kernels/gemm_plan.h"
#include "kernels/quant.h"

namespace ztrain::kernels {

// The heads of one attention op (Ops::AttentionForward): num_heads query heads and
// num_kv_heads key/value heads (dividing num_heads) of head_dim features each.
struct AttentionHeads {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int64_t q_width() const { return int64_t{num_heads} * head_dim; }
  int64_t kv_width() const { return int64_t{num_kv_heads} * head_dim; }
  int64_t qkv_width() const { return q_width() + 2 * kv_width(); }
  // GPT-2's heads: qkv [B,T,3C] split into num_heads heads of C / num_heads.
  static AttentionHeads MultiHead(const Tensor& qkv, int num_heads) {
    const int64_t width = qkv.dim() == 3 ? qkv.size(2) : 0;
    return {num_heads, num_heads, num_heads > 0 ? static_cast<int>(width / 3 / num_heads) : 0};
  }
};

// Which keys each query of an attention op sees, beyond causality (Note [Attention masks] in
// kernels/cpu/attention_tile.h). Query i always sees keys j <= i. With window > 0 it sees only
// the last `window` of them, j > i - window (Hugging Face's sliding_window_overlay: Mistral's
// and Qwen2's sliding_window). With positions defined (int32 [B, T], on the op's device) the
// sequences are packed from documents: positions[b][t] is t's position within its document,
// 0 at each document's first token and counting up by one (Hugging Face's padding-free
// position_ids, DataCollatorWithFlattening), and query i sees only keys of its own document,
// j >= i - positions[b][i]. The default is plain causal attention.
// With offset != 0 the queries and keys of the qkv rows are different pieces of one sequence
// (ring attention's blocks, Note [Ring attention] in nn/context_parallel.h): query row i sits
// at key index i + offset, so it sees keys j <= i + offset, its window and its document
// (positions are the query rows') counted back from there; a row that sees no key gets a zero
// output and a log-sum-exp of -infinity. The first row's position may be above 0 (a document
// that began before these rows).
struct AttentionMask {
  int64_t window = 0;
  Tensor positions;
  int64_t offset = 0;
  bool causal_only() const { return window <= 0 && !positions.defined() && offset == 0; }
};

// The ids a table (or logit columns) holds: ids [begin, begin + rows) of a vocabulary of ids
// [0, vocab), rows being the tensor's. The whole table is {0, its rows}; one rank's slice of a
// vocabulary-parallel embedding or head (Megatron's VocabParallelEmbedding and
// vocabulary-parallel cross-entropy, parallel/tensor/megatron_*.cc) is {rank * rows, the whole
// vocabulary}. Embeddings take the padded vocabulary (every row is an id a token may have);
// the cross-entropy takes the real one, ids past it being padding.
struct VocabSlice {
  int64_t begin = 0;
  int64_t vocab = 0;
  // The whole of `table` (undefined or of no dimension: an empty vocabulary, which the ops'
  // checks then report on the table itself).
  static VocabSlice Whole(const Tensor& table) {
    return {0, table.defined() && table.dim() >= 1 ? table.size(0) : 0};
  }
  // How many of `rows` ids from begin are in the vocabulary (the rest are padding).
  int64_t RealRows(int64_t rows) const { return std::clamp<int64_t>(vocab - begin, 0, rows); }
};

// The three steps of the vocabulary-parallel cross-entropy (Ops::VocabParallelCrossEntropy),
// each followed on the caller's side by the tp group's all-reduce of what it wrote.
enum class CrossEntropyStep {
  kMax,     // the row maxima (then all-reduced kMax)
  kSumExp,  // the sums of exp and the target logits (then all-reduced kSum)
  kLoss,    // the losses from the reduced statistics (no collective)
};

// Note [Copies beside the ops]: a backend that runs ops asynchronously (CUDA) may run
// host<->device copies on a copy engine beside them, so that a copy issued for later (ZeRO-3
// bringing an offloaded layer to the device) hides behind the ops computing now. Such a copy
// starts only after the ops issued before it (its dst may be memory they freed), and the ops
// issued after it see its result only once WaitCopy(ticket) has been issued. Until the copy
// has finished (after the WaitCopy, or Synchronize), src must not change and both sides
// must stay allocated; a pageable host src may go once CopyBeside returns, as the driver has
// then staged it. Converting dtypes needs the ops' kernels, so CUDA's copies beside the ops
// move bytes only: one dtype, one side on the host.
struct CopyTicket {
  uint64_t id = 0;  // 0: nothing to wait for
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  // Bytes the ops keep for themselves between calls: outside every caller's tensors, and so
  // outside every MemoryTracker (CpuOps: the widening adapter's fp32 scratch for 16-bit
  // arguments, Note [Widening adapter]). 0 where there is none.
  virtual int64_t ScratchBytes() const { return 0; }
  // The backend for each fp32 GEMM shape, chosen by measurement (Note [GEMMs chosen by
  // measurement] in kernels/cpu/gemm_choice.h); a backend with one GEMM library ignores it.
  virtual void UseGemmPlan(const GemmPlan& plan) { (void)plan; }

  // c[M,N] = alpha * op(a) @ op(b) + beta * c, op = transpose when the flag is set.
  // a is [M,K] (or [K,M] when trans_a), b is [K,N] (or [N,K] when trans_b).
  virtual void Gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                    float beta, const Tensor& c) = 0;

  // y[N,OC] = x[N,C] @ weight[OC,C]^T + bias[OC] (bias may be an undefined Tensor).
  virtual void LinearForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& y) = 0;
  // dx[N,C] = dy @ weight (skipped when dx is undefined); dweight += dy^T @ x (skipped when
  // dweight is undefined: Note [Frozen parameters]); dbias += sum over rows of dy (skipped
  // when dbias is undefined).
  virtual void LinearBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& dx, const Tensor& dweight, const Tensor& dbias) = 0;

  // out[B,T,C] = wte[tokens[b,t]] + wpe[t]. tokens int32 [B,T], wte [Vp,C], wpe [maxT,C].
  // wpe may be an undefined Tensor: a model without a position table (Llama: positions enter
  // through RopeForward), out = wte[tokens[b,t]].
  // A token outside [0, Vp) throws naming the token and its position.
  // With a VocabSlice, wte holds ids [slice.begin, slice.begin + wte rows) of slice.vocab: a
  // token of the slice reads its row, any other token a zero row (+ wpe[t]), so that the sum
  // of the slices' outputs is the whole lookup; a token outside [0, slice.vocab) throws.
  virtual void EmbeddingForward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                const Tensor& out, const VocabSlice& slice) = 0;
  void EmbeddingForward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                        const Tensor& out) {
    EmbeddingForward(tokens, wte, wpe, out, VocabSlice::Whole(wte));
  }
  // dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += dout[b,t]. Each is skipped when undefined
  // (dwpe: no position table, or a frozen one; dwte: a frozen token table, Note [Frozen
  // parameters]), both undefined doing nothing; C is dout's last dimension then. Without
  // dwte the tokens' values are not read (nor checked), only their shape. Deterministic.
  // With a VocabSlice (as in EmbeddingForward), dwte holds the slice's rows and only the
  // tokens of the slice add into it.
  virtual void EmbeddingBackward(const Tensor& dout, const Tensor& tokens, const Tensor& dwte,
                                 const Tensor& dwpe, const VocabSlice& slice) = 0;
  void EmbeddingBackward(const Tensor& dout, const Tensor& tokens, const Tensor& dwte,
                         const Tensor& dwpe) {
    EmbeddingBackward(dout, tokens, dwte, dwpe, VocabSlice::Whole(dwte));
  }

  // y[N,C] = (x - mean) * rstd * weight + bias, eps = 1e-5; saves mean[N] and rstd[N] (fp32).
  virtual void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                const Tensor& y, const Tensor& mean, const Tensor& rstd) = 0;
  // dx (overwritten), dweight and dbias (accumulated; either or both may be undefined,
  // Note [Frozen parameters]).
  virtual void LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                 const Tensor& dweight, const Tensor& dbias) = 0;

  // RMSNorm (Llama, Qwen2, Mistral): y[N,C] = x * rstd * weight with rstd[N] =
  // 1 / sqrt(mean_c(x^2) + eps), computed in fp32 and saved (fp32) for the backward; the
  // weight multiplies the normalised value, eps sits inside the square root.
  virtual void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                              const Tensor& rstd) = 0;
  // dx (overwritten) and dweight (accumulated; may be undefined, Note [Frozen parameters]).
  virtual void RmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                               const Tensor& rstd, const Tensor& dx, const Tensor& dweight) = 0;

  // Causal self-attention over query heads and key/value heads (AttentionHeads: NH query
  // heads, NKV key/value heads, HS features each; NKV divides NH and query head h reads KV
  // head h / (NH / NKV), so each KV head serves NH/NKV consecutive query heads: NKV = NH is
  // multi-head attention, 1 < NKV < NH grouped-query, NKV = 1 multi-query). qkv
  // [B,T,(NH+2*NKV)*HS] holds q, k, v side by side: q in columns [0, NH*HS), k in
  // [NH*HS, (NH+NKV)*HS), v after; head h of each uses HS consecutive columns. out
  // [B,T,NH*HS] (heads side by side), lse [B,NH,T] = log-sum-exp of each query's scores
  // scaled by 1/sqrt(HS), saved for backward. Never materialises a [B,NH,T,T] tensor: tiles
  // over keys with an online softmax (FlashAttention). `mask` narrows the keys each query
  // sees (AttentionMask: a sliding window, packed documents); a backend without masks throws
  // naming the device.
  virtual void AttentionForward(const Tensor& qkv, const AttentionHeads& heads,
                                const AttentionMask& mask, const Tensor& out,
                                const Tensor& lse) = 0;
  // dqkv [B,T,(NH+2*NKV)*HS] overwritten from dout [B,T,NH*HS], recomputing probabilities
  // from qkv and lse under the forward's mask; a KV head's gradient sums over the query heads
  // it serves.
  virtual void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                 const Tensor& lse, const AttentionHeads& heads,
                                 const AttentionMask& mask, const Tensor& dqkv) = 0;
  // Plain causal attention.
  void AttentionForward(const Tensor& qkv, const AttentionHeads& heads, const Tensor& out,
                        const Tensor& lse) {
    AttentionForward(qkv, heads, AttentionMask{}, out, lse);
  }
  void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                         const Tensor& lse, const AttentionHeads& heads, const Tensor& dqkv) {
    AttentionBackward(dout, qkv, out, lse, heads, AttentionMask{}, dqkv);
  }
  // GPT-2's multi-head form: qkv [B,T,3C], NH = NKV = num_heads, HS = C / num_heads.
  void AttentionForward(const Tensor& qkv, int num_heads, const Tensor& out, const Tensor& lse) {
    AttentionForward(qkv, AttentionHeads::MultiHead(qkv, num_heads), out, lse);
  }
  void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                         const Tensor& lse, int num_heads, const Tensor& dqkv) {
    AttentionBackward(dout, qkv, out, lse, AttentionHeads::MultiHead(qkv, num_heads), dqkv);
  }

  // Rotary position embedding in the rotate-half convention (Hugging Face's Llama), applied
  // IN PLACE to the query and key heads of qkv [B,T,(NH+2*NKV)*HS] (the layout above; v is
  // left alone). In each head, element i < HS/2 pairs with element i + HS/2; at position t
  // (0-based within the sequence) the pair turns by the angle a = t * inv_freq[i]:
  //   x'[i] = x[i] cos a - x[i + HS/2] sin a,   x'[i + HS/2] = x[i + HS/2] cos a + x[i] sin a.
  // inv_freq is fp32 [HS/2] on this device (RoPE scaling is folded into it by the caller); the
  // angle is the fp32 product and cos/sin are taken in fp32, as transformers computes them.
  // With `first_position`, the T rows are positions first_position .. first_position + T - 1
  // (incremental decoding: Note [KV cache], nn/decoder.h); the angle is the fp32 product
  // (first_position + t) * inv_freq, as for a whole sequence. `scale` multiplies cos and sin
  // (in fp32, before they meet x: transformers' attention_scaling, YaRN's factor; 1 otherwise).
  // With `positions` defined (int32 [B,T] on this device: packed documents, AttentionMask's
  // positions), row (b, t) is at position positions[b][t] instead (Hugging Face's
  // position_ids), with the same fp32 angle; first_position must then be 0. A backend without
  // per-token positions throws naming them.
  virtual void RopeForward(const Tensor& qkv, const AttentionHeads& heads, const Tensor& inv_freq,
                           int64_t first_position, float scale, const Tensor& positions) = 0;
  void RopeForward(const Tensor& qkv, const AttentionHeads& heads, const Tensor& inv_freq,
                   int64_t first_position, float scale) {
    RopeForward(qkv, heads, inv_freq, first_position, scale, Tensor());
  }
  void RopeForward(const Tensor& qkv, const AttentionHeads& heads, const Tensor& inv_freq,
                   int64_t first_position) {
    RopeForward(qkv, heads, inv_freq, first_position, 1.0f, Tensor());
  }
  void RopeForward(const Tensor& qkv, const AttentionHeads& heads, const Tensor& inv_freq) {
    RopeForward(qkv, heads, inv_freq, 0, 1.0f, Tensor());
  }
  // The backward: the transpose of the rotation (the same pairs turned by -a, cos and sin times
  // the same scale), IN PLACE on the query and key heads of dqkv, so that the gradient with
  // respect to the rotated q and k becomes the gradient with respect to the unrotated ones; v's
  // gradient is left alone. `positions` as in the forward.
  virtual void RopeBackward(const Tensor& dqkv, const AttentionHeads& heads, const Tensor& inv_freq,
                            float scale, const Tensor& positions) = 0;
  void RopeBackward(const Tensor& dqkv, const AttentionHeads& heads, const Tensor& inv_freq,
                    float scale) {
    RopeBackward(dqkv, heads, inv_freq, scale, Tensor());
  }
  void RopeBackward(const Tensor& dqkv, const AttentionHeads& heads, const Tensor& inv_freq) {
    RopeBackward(dqkv, heads, inv_freq, 1.0f, Tensor());
  }

  // Ring attention's merge (Note [Ring attention] in nn/context_parallel.h): a block's partial
  // attention `part` [B,T,NH*HS] with its log-sum-exp `part_lse` [B,NH,T] (fp32; -infinity
  // where a row saw no key of the block) folded into the running `out` (fp32, same shape) and
  // `lse` (fp32), in fp32: lse' = log(exp(lse) + exp(part_lse)),
  // out' = out exp(lse - lse') + part exp(part_lse - lse'). part is fp32 or 16-bit. The
  // default throws naming the device.
  virtual void MergeAttention(const Tensor& out, const Tensor& lse, const Tensor& part,
                              const Tensor& part_lse);

  // Attention of T new positions over a KV cache (Note [KV cache], nn/decoder.h). qkv
  // [T,(NH+2*NKV)*HS]: the new positions' projections in the layout above (only q is read);
  // k_cache and v_cache [L,NKV*HS], L >= T, hold every position's keys and values, the new
  // positions' as the last T rows; out [T,NH*HS]: new position i attends causally to cache rows
  // 0 .. L-T+i, scores scaled by 1/sqrt(HS), softmax in fp32. All fp32. The default throws
  // naming the device: not every backend decodes.
  virtual void AttentionDecode(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                               const AttentionHeads& heads, const Tensor& out);

  // SwiGLU (Llama's MLP activation): h = silu(gate) * up elementwise, silu(g) = g / (1 + e^-g).
  // gate, up and h have one shape (any).
  virtual void SwiGluForward(const Tensor& gate, const Tensor& up, const Tensor& h) = 0;
  // dgate = dh * up * silu'(gate), dup = dh * silu(gate) (both overwritten).
  virtual void SwiGluBackward(const Tensor& dh, const Tensor& gate, const Tensor& up,
                              const Tensor& dgate, const Tensor& dup) = 0;

  // y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise, any shape.
  virtual void GeluForward(const Tensor& x, const Tensor& y) = 0;
  // dx = dy * gelu'(x) (overwritten).
  virtual void GeluBackward(const Tensor& dy, const Tensor& x, const Tensor& dx) = 0;

  // y = a + b, elementwise (y may alias a or b).
  virtual void Add(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
  // y += x, elementwise.
  virtual void AddInPlace(const Tensor& y, const Tensor& x) = 0;
  // y[n,c] = sum[n,c] + (bias[n mod R, c] + residual[n,c]), in fp32, rounded once into y: the
  // tail of a sum over a tensor-parallel group (Note [Tensor parallelism in 16 bits] in
  // parallel/tensor/tp_common.h), a row-parallel linear's bias and residual or the embedding's
  // position rows. sum fp32 [N,C] (it may be y when y is fp32); bias [R,C] with R dividing N,
  // or [C] (R = 1), or undefined (0); residual [N,C] or undefined (0); y [N,C]. The leading
  // dimensions of [N,C] tensors may be split ([B,T,C]).
  virtual void AddBiasAndResidual(const Tensor& sum, const Tensor& bias, const Tensor& residual,
                                  const Tensor& y) = 0;
  // Column windows of a row-major matrix (LoRA on packed q/k/v projections, whose update
  // adds into, and whose gradient reads from, the columns of one projection):
  // y[:, column:column+w] += alpha * x for y [N, W] and x [N, w], 0 <= column and
  // column + w <= W. y and x have one dtype, fp32, bf16 or fp16 (16-bit: computed in fp32,
  // rounded once, Note [16-bit tensors]); x must not overlap y.
  virtual void AddColumns(const Tensor& y, int64_t column, const Tensor& x, float alpha) = 0;
  // y = x[:, column:column+w] for x [N, W] and y [N, w] (the window as above): the bytes,
  // any dtype of 2 or 4 bytes, the same for both; y must not overlap x.
  virtual void CopyColumns(const Tensor& x, int64_t column, const Tensor& y) = 0;
  // A quantized weight's piece (kernels/quant.h: QLoRA's frozen base) back into numbers:
  // out [geometry.rows, geometry.cols] (fp32, bf16 or fp16) from `blob`, U8
  // [LayoutOf(format, geometry).total] on this device. Each value is bitsandbytes' fp32
  // dequantization (4-bit: codebook[code] * absmax, the absmax double-dequantized first;
  // INT8: (code * row_absmax) * fp32(1/127)), rounded once to out's dtype.
  virtual void Dequantize(const Tensor& blob, const QuantFormat& format,
                          const QuantGeometry& geometry, const Tensor& out) = 0;
  // LoRA dropout (kernels/dropout.h): y = x * keep(r, c) / (1 - p) elementwise for x and y
  // [rows, cols] of one float dtype (16-bit: computed in fp32, rounded once); y may be x.
  virtual void Dropout(const Tensor& x, const DropoutMask& mask, const Tensor& y) = 0;
  // t = 0.
  virtual void Zero(const Tensor& t) = 0;
  // dst = src (same shape). Equal dtypes copy bytes (any dtype); between two float dtypes the
  // values are converted, rounding to nearest even when narrowing. Either may be host memory
  // instead of this device's (the host<->device copies of a CUDA backend); read a copy into
  // the host only after Synchronize().
  virtual void Copy(const Tensor& src, const Tensor& dst) = 0;
  // Waits until every op issued so far has finished, copies beside them included (a no-op
  // where ops run synchronously).
  virtual void Synchronize() = 0;
  // A host<->device copy beside the ops (Note [Copies beside the ops]): dst = src, as Copy
  // (CUDA: of one dtype, one side host memory). Returns at once; the copy starts once every op
  // issued before it has finished, and the ops issued after it do not wait for it until
  // WaitCopy(ticket). Here, synchronously: Copy, and a ticket with nothing to wait for.
  virtual CopyTicket CopyBeside(const Tensor& src, const Tensor& dst) {
    Copy(src, dst);
    return {};
  }
  // The ops issued after this call run after the ticket's copy (on a device, a wait on the
  // device: the host does not block). Each ticket is waited for at most once; a ticket
  // never waited for is dropped by Synchronize.
  virtual void WaitCopy(CopyTicket ticket) { static_cast<void>(ticket); }

  // Fused softmax + cross-entropy over a padded vocabulary. logits [N,Vp] (any float dtype),
  // targets int32 [N], losses and dlosses fp32 [N]; only columns [0,V) take part.
  // losses[N] = -log softmax(logits)[target].
  // When dlosses is defined ([N], the gradient of the objective w.r.t. each loss), logits are
  // overwritten IN PLACE with dlogits = (softmax - onehot(target)) * dlosses[n], and the
  // padded columns [V,Vp) with 0, so no second [N,Vp] buffer is needed. A target equal to
  // kIgnoreTarget has loss 0 and a row of zero dlogits; any other outside [0,V) throws naming it.
  virtual void SoftmaxCrossEntropy(const Tensor& logits, const Tensor& targets, int64_t vocab,
                                   const Tensor& losses, const Tensor& dlosses) = 0;

  // The vocabulary-parallel cross-entropy (Megatron's), one rank's part, in the three steps
  // of CrossEntropyStep around the tp group's all-reduces (parallel/tensor/megatron_loss.cc).
  // logits [N,Vl] (any float dtype) are the columns of ids [slice.begin, slice.begin + Vl);
  // those at or past slice.vocab (the real vocabulary) are padding and take no part. stats
  // fp32 [3,N]: row 0 the max, row 1 the sum of exp, row 2 the target's logit; targets int32
  // [N]; losses fp32 [N].
  //   kMax: stats[0][n] = the max of row n's real columns (-inf when the slice has none).
  //         Checks every target first: one outside [0, slice.vocab) other than kIgnoreTarget
  //         throws naming it and its row, before anything is written (so every rank throws
  //         before a collective). An ignored target's loss is 0 and its dlogits 0.
  //   kSumExp: with stats[0] the max over the group, stats[1][n] = the sum of
  //         exp(z - stats[0][n]) over the real columns, stats[2][n] = the target's logit when
  //         the slice holds the target, else 0.
  //   kLoss: with stats[1] and stats[2] summed over the group, losses[n] =
  //         log(stats[1][n]) + stats[0][n] - stats[2][n]. logits and targets are not read.
  virtual void VocabParallelCrossEntropy(CrossEntropyStep step, const Tensor& logits,
                                         const Tensor& targets, const VocabSlice& slice,
                                         const Tensor& stats, const Tensor& losses) = 0;
  // Its backward from the reduced stats: logits overwritten IN PLACE with dlogits =
  // (exp(z - max) / sum_exp - [id == target]) * dlosses[n] on the real columns, 0 on the
  // padded ones. dlosses fp32 [N]. No collective is needed for it.
  virtual void VocabParallelCrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                                 const VocabSlice& slice, const Tensor& stats,
                                                 const Tensor& dlosses) = 0;

  // Sum of squares of every element of `t` (any float dtype, widened; double accumulation).
  virtual double SumSquares(const Tensor& t) = 0;
  // t *= alpha.
  virtual void Scale(const Tensor& t, float alpha) = 0;
};

// The CPU implementation (OpenBLAS + OpenMP), always available.
std::unique_ptr<Ops> MakeCpuOps();

// Choices of the CUDA backend, made once when its ops are built.
struct CudaOpsOptions {
  // bf16 and fp16 attention on tensor cores (kernels/cuda/attention_tc.cu, Note [Tensor-core
  // attention]) instead of the fp32-arithmetic kernels. Written after the first GPU run
  // showed attention at three quarters of a bf16 step (docs/gpu.md), compiled, not yet run
  // on a GPU: off until the cross-backend test has passed on one.
  bool tensor_core_attention = false;
};

// The CUDA implementation on device `device` (kernels/cuda/cuda_ops.h). Throws ztrain::Error
// when the build has no CUDA or the device does not exist.
std::unique_ptr<Ops> MakeCudaOps(int device, const CudaOpsOptions& options = {});
// The product Ops::Gemm computes for these operands (their dtypes and devices are each
// backend's to check): a, b and c 2-D, op(b)'s K equal to op(a)'s, c [M, N]; otherwise
// ztrain::Error naming `op`, the shapes and what was expected.
GemmShape CheckGemmShapes(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b,
                          const Tensor& c, const char* op);

// CUDA devices visible to this process; 0 without CUDA (the build or the machine).
int CudaDeviceCount();
// What a config's "auto"s need to know of a CUDA device (run/run_config.h).
struct CudaDeviceInfo {
  int major = 0, minor = 0;  // compute capability
  int64_t total_bytes = 0;   // device memory
  std::string name;
};
// Device `device`'s properties; ztrain::Error when it does not exist or the build has no CUDA.
CudaDeviceInfo GetCudaDeviceInfo(int device);
// Whether this machine's CPU computes bf16 matmuls natively (AVX512-BF16 or AMX-BF16, through
// oneDNN in this build), and a few words on why or why not.
bool CpuHasBf16(std::string* why = nullptr);

}  // namespace ztrain::kernels
