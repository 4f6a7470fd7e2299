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
//   unless the comment says otherwise.
// - Dtypes (Note [16-bit tensors]): every floating-point tensor argument may be fp32, bf16 or
//   fp16, independently of the others, except the ones fixed as fp32: LayerNorm's mean and
//   rstd, attention's lse, SoftmaxCrossEntropy's losses and dlosses. (Its logits may be
//   16-bit; the dlogits written over them in place are then 16-bit too.) tokens and targets
//   are int32. A backend may implement a subset and says which in its header: CpuOps takes
//   every combination; CudaOps takes fp32 or bf16, one dtype per op (kernels/cuda/cuda_ops.h).
// - Ops may run multi-threaded internally; an Ops object is used by one thread at a time.
// - Ops may run asynchronously (CUDA: enqueued on the object's stream, in issue order):
//   results reach the host only through Copy followed by Synchronize, or SumSquares.
//
// Note [16-bit tensors]: arithmetic is fp32 whatever the dtypes. 16-bit inputs are widened
// exactly; each 16-bit output is rounded once, to nearest even, when it is stored. Accumulated
// outputs (dweight, dbias, dwte, dwpe, AddInPlace's y, Gemm's c when beta != 0) are read,
// added to in fp32 and rounded once. So an op on 16-bit tensors gives the fp32 op's result on
// the same (widened) values, rounded to each output's dtype; on the CPU bit for bit, except
// GEMMs on two bf16 operands, which run on bf16 hardware through oneDNN with fp32
// accumulation in another summation order (each product of two bf16 values is exact in fp32).
// GEMMs with an fp16 operand run in fp32: the CPUs we target have no AMX-FP16 or AVX512-FP16
// dot products, so fp16 hardware GEMMs would gain nothing there. The determinism stated below
// (EmbeddingBackward, the CPU backend's reductions) holds for every dtype.
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace ztrain::kernels {

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  // Bytes the ops keep for themselves between calls: outside every caller's tensors, and so
  // outside every MemoryTracker (CpuOps: the widening adapter's fp32 scratch for 16-bit
  // arguments, Note [Widening adapter]). 0 where there is none.
  virtual int64_t ScratchBytes() const { return 0; }

  // c[M,N] = alpha * op(a) @ op(b) + beta * c, op = transpose when the flag is set.
  // a is [M,K] (or [K,M] when trans_a), b is [K,N] (or [N,K] when trans_b).
  virtual void Gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                    float beta, const Tensor& c) = 0;

  // y[N,OC] = x[N,C] @ weight[OC,C]^T + bias[OC] (bias may be an undefined Tensor).
  virtual void LinearForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& y) = 0;
  // dx[N,C] = dy @ weight (skipped when dx is undefined); dweight += dy^T @ x;
  // dbias += sum over rows of dy (skipped when dbias is undefined).
  virtual void LinearBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& dx, const Tensor& dweight, const Tensor& dbias) = 0;

  // out[B,T,C] = wte[tokens[b,t]] + wpe[t]. tokens int32 [B,T], wte [Vp,C], wpe [maxT,C].
  // A token outside [0, Vp) throws naming the token and its position.
  virtual void EmbeddingForward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                const Tensor& out) = 0;
  // dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += dout[b,t]. Deterministic.
  virtual void EmbeddingBackward(const Tensor& dout, const Tensor& tokens, const Tensor& dwte,
                                 const Tensor& dwpe) = 0;

  // y[N,C] = (x - mean) * rstd * weight + bias, eps = 1e-5; saves mean[N] and rstd[N] (fp32).
  virtual void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                const Tensor& y, const Tensor& mean, const Tensor& rstd) = 0;
  // dx (overwritten), dweight and dbias (accumulated).
  virtual void LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                 const Tensor& dweight, const Tensor& dbias) = 0;

  // Causal multi-head self-attention. qkv [B,T,3C] holds q, k, v side by side (q in columns
  // [0,C), k in [C,2C), v in [2C,3C); head h uses columns [h*HS, (h+1)*HS) of each, HS = C/NH).
  // out [B,T,C] (heads side by side), lse [B,NH,T] = log-sum-exp of each query's scaled
  // scores, saved for backward. Never materialises a [B,NH,T,T] tensor: tiles over keys with
  // an online softmax (FlashAttention).
  virtual void AttentionForward(const Tensor& qkv, int num_heads, const Tensor& out,
                                const Tensor& lse) = 0;
  // dqkv [B,T,3C] overwritten from dout [B,T,C], recomputing probabilities from qkv and lse.
  virtual void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                 const Tensor& lse, int num_heads, const Tensor& dqkv) = 0;

  // y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise, any shape.
  virtual void GeluForward(const Tensor& x, const Tensor& y) = 0;
  // dx = dy * gelu'(x) (overwritten).
  virtual void GeluBackward(const Tensor& dy, const Tensor& x, const Tensor& dx) = 0;

  // y = a + b, elementwise (y may alias a or b).
  virtual void Add(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
  // y += x, elementwise.
  virtual void AddInPlace(const Tensor& y, const Tensor& x) = 0;
  // t = 0.
  virtual void Zero(const Tensor& t) = 0;
  // dst = src (same shape). Equal dtypes copy bytes (any dtype); between two float dtypes the
  // values are converted, rounding to nearest even when narrowing. Either may be host memory
  // instead of this device's (the host<->device copies of a CUDA backend); read a copy into
  // the host only after Synchronize().
  virtual void Copy(const Tensor& src, const Tensor& dst) = 0;
  // Waits until every op issued so far has finished (a no-op where ops run synchronously).
  virtual void Synchronize() = 0;

  // Fused softmax + cross-entropy over a padded vocabulary. logits [N,Vp] (any float dtype),
  // targets int32 [N], losses and dlosses fp32 [N]; only columns [0,V) take part.
  // losses[N] = -log softmax(logits)[target].
  // When dlosses is defined ([N], the gradient of the objective w.r.t. each loss), logits are
  // overwritten IN PLACE with dlogits = (softmax - onehot(target)) * dlosses[n], and the
  // padded columns [V,Vp) with 0, so no second [N,Vp] buffer is needed. A target outside
  // [0,V) throws naming it.
  virtual void SoftmaxCrossEntropy(const Tensor& logits, const Tensor& targets, int64_t vocab,
                                   const Tensor& losses, const Tensor& dlosses) = 0;

  // Sum of squares of every element of `t` (any float dtype, widened; double accumulation).
  virtual double SumSquares(const Tensor& t) = 0;
  // t *= alpha.
  virtual void Scale(const Tensor& t, float alpha) = 0;
};

// The CPU implementation (OpenBLAS + OpenMP), always available.
std::unique_ptr<Ops> MakeCpuOps();

// The CUDA implementation on device `device` (kernels/cuda/cuda_ops.h). Throws ztrain::Error
// when the build has no CUDA or the device does not exist.
std::unique_ptr<Ops> MakeCudaOps(int device);
// CUDA devices visible to this process; 0 without CUDA (the build or the machine).
int CudaDeviceCount();
// What a config's "auto"s need to know of a CUDA device (engine/run_config.h).
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
