#pragma once
// CudaOps: the op set on one CUDA device (DESIGN.md "kernels"; the contract is kernels/ops.h).
//
// Every op is enqueued on the object's stream and returns without waiting (SumSquares, which
// returns a value to the host, synchronises). The stream is a blocking stream, so work on the
// legacy default stream (where NcclCommunicator orders its collectives) waits for the ops
// issued before it: a collective on an op's output needs no host synchronisation. Tensors live on
// this device, contiguous, row-major. Floating-point tensors are fp32, bf16 or fp16, mixed within
// an op as ops.h allows: one dtype for the op's tensors (and fp32 parameter gradients over 16-bit
// inputs) runs the kernels directly, every other combination through the widening adapter
// (Note [Mixed dtypes on CUDA] in widen.h); arithmetic accumulates in fp32. GEMMs go through cuBLAS
// / cuBLASLt (bias and GELU fused in the epilogue where cuBLASLt offers it), the rest through the
// kernels in kernels/cuda/*.cu: fused LayerNorm and RMSNorm, flash-style causal attention with
// grouped key/value heads (online softmax, no T x T matrix in device memory; head_dim at most 128),
// RoPE in place, SwiGLU, a fused softmax + cross-entropy that writes the logits' gradient in place,
// the tensor-parallel pieces (the embedding over a vocabulary slice into an fp32 partial,
// AddBiasAndResidual, the vocabulary-parallel cross-entropy's steps), and deterministic
// backwards (no floating-point atomics in the embedding, norm and attention gradients: the
// same result every run). AddColumns also takes fp16 (ops.h lets it), CopyColumns
// any dtype of 2 or 4 bytes (it moves bytes), like Zero, and Copy converts between the float
// dtypes (rounding to nearest even), on the device also for a host side; Dequantize reads a U8 blob
// (kernels/quant.h, 4-byte aligned) and writes fp32, bf16 or fp16, the CPU backend's values bit for bit
// (kernels/cuda/dequantize.cu). An undefined parameter gradient
// is skipped (Note [Frozen parameters] in ops.h): nothing is launched for it, and the other outputs
// are the same bits. Shapes and dtypes are checked on the host before anything is enqueued, so a
// throwing op has enqueued nothing. CopyBeside puts host<->device copies on a second,
// non-blocking stream beside the ops (Note [Copies beside the ops] in ops.h,
// kernels/cuda/copy_beside.cc). One thread at a time per object, as every Ops.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>

#include "kernels/cuda/widen.h"
#include "kernels/ops.h"

namespace ztrain::kernels::cuda {

class CudaOps final : public Ops {
 public:
  // Selects `device` (cudaSetDevice) and creates the stream and the cuBLAS handles.
  explicit CudaOps(int device, const CudaOpsOptions& options = {});
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  Device device() const override { return Device::Cuda(device_); }
  // The workspace and the widening adapter's scratch (Note [Mixed dtypes on CUDA]).
  int64_t ScratchBytes() const override {
    return static_cast<int64_t>(workspace_bytes_ + scratch_.bytes());
  }
  cudaStream_t stream() const { return stream_; }
  // The widening adapter's buffers (widen.h).
  DeviceScratch& scratch() { return scratch_; }

  void Gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
            float beta, const Tensor& c) override;
  void LinearForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                     const Tensor& y) override;
  void LinearBackward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& dx,
                      const Tensor& dweight, const Tensor& dbias) override;

  using Ops::EmbeddingBackward;
  using Ops::EmbeddingForward;
  void EmbeddingForward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                        const Tensor& out, const VocabSlice& slice) override;
  void EmbeddingBackward(const Tensor& dout, const Tensor& tokens, const Tensor& dwte,
                         const Tensor& dwpe, const VocabSlice& slice) override;

  void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Tensor& y, const Tensor& mean, const Tensor& rstd) override;
  void LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                         const Tensor& dweight, const Tensor& dbias) override;

  void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                      const Tensor& rstd) override;
  void RmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Tensor& rstd, const Tensor& dx, const Tensor& dweight) override;

  using Ops::AttentionBackward;
  using Ops::AttentionForward;
  void AttentionForward(const Tensor& qkv, const AttentionHeads& heads, const AttentionMask& mask,
                        const Tensor& out, const Tensor& lse) override;
  void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                         const Tensor& lse, const AttentionHeads& heads, const AttentionMask& mask,
                         const Tensor& dqkv) override;
  using Ops::RopeBackward;
  using Ops::RopeForward;
  void RopeForward(const Tensor& qkv, const AttentionHeads& heads, const Tensor& inv_freq,
                   int64_t first_position, float scale, const Tensor& positions) override;
  void RopeBackward(const Tensor& dqkv, const AttentionHeads& heads, const Tensor& inv_freq,
                    float scale, const Tensor& positions) override;
  void SwiGluForward(const Tensor& gate, const Tensor& up, const Tensor& h) override;
  void SwiGluBackward(const Tensor& dh, const Tensor& gate, const Tensor& up,
                      const Tensor& dgate, const Tensor& dup) override;

  void GeluForward(const Tensor& x, const Tensor& y) override;
  void GeluBackward(const Tensor& dy, const Tensor& x, const Tensor& dx) override;

  void Add(const Tensor& a, const Tensor& b, const Tensor& y) override;
  void AddInPlace(const Tensor& y, const Tensor& x) override;
  void AddBiasAndResidual(const Tensor& sum, const Tensor& bias, const Tensor& residual,
                          const Tensor& y) override;
  void AddColumns(const Tensor& y, int64_t column, const Tensor& x, float alpha) override;
  void CopyColumns(const Tensor& x, int64_t column, const Tensor& y) override;
  void Dequantize(const Tensor& blob, const QuantFormat& format, const QuantGeometry& geometry,
                  const Tensor& out) override;
  void Dropout(const Tensor& x, const DropoutMask& mask, const Tensor& y) override;
  void Zero(const Tensor& t) override;
  void Copy(const Tensor& src, const Tensor& dst) override;
  // Synchronize waits for the copy stream too (kernels/cuda/copy_beside.cc).
  void Synchronize() override;
  CopyTicket CopyBeside(const Tensor& src, const Tensor& dst) override;
  void WaitCopy(CopyTicket ticket) override;

  void SoftmaxCrossEntropy(const Tensor& logits, const Tensor& targets, int64_t vocab,
                           const Tensor& losses, const Tensor& dlosses) override;
  void VocabParallelCrossEntropy(CrossEntropyStep step, const Tensor& logits,
                                 const Tensor& targets, const VocabSlice& slice,
                                 const Tensor& stats, const Tensor& losses) override;
  void VocabParallelCrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                         const VocabSlice& slice, const Tensor& stats,
                                         const Tensor& dlosses) override;

  double SumSquares(const Tensor& t) override;
  void Scale(const Tensor& t, float alpha) override;

  // Device scratch of at least `bytes`, owned by this object, valid until the next call
  // (grown on demand, stream-ordered). For kernels that need temporary space (bias-gradient
  // partial sums, reductions).
  void* Workspace(size_t bytes);

 private:
  int device_;
  CudaOpsOptions options_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  DeviceScratch scratch_;
  // Note [Copies beside the ops] (ops.h): a non-blocking stream and the event that orders a
  // copy after the ops issued before it, made at the first CopyBeside, and each copy's
  // completion event until it is waited for or synchronised.
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t issued_ = nullptr;
  std::map<uint64_t, cudaEvent_t> copies_;
  uint64_t last_copy_ = 0;
};

}  // namespace ztrain::kernels::cuda
