#pragma once
// CpuOps: the op set on the host (OpenBLAS for GEMMs, OpenMP + vectorised loops for the rest,
// oneDNN for GEMMs on two bf16 operands where the build and the CPU have it).
//
// Owns no tensor memory: every op works on caller-owned Tensors. Every floating-point argument
// may be fp32, bf16 or fp16 independently of the others, except those ops.h fixes as fp32
// (the contract is in ops.h's conventions). The kernels are fp32; 16-bit arguments go through
// the widening adapter (Note [Widening adapter] in widen.h), whose fp32 scratch the object
// keeps between calls (ScratchBytes()), and GEMMs on two bf16 operands through oneDNN
// (Note [bf16 GEMMs] in gemm_mixed.cc). Calls whose arguments are all fp32 run the fp32
// kernels directly, as before the 16-bit path existed. Zero moves bytes and takes every
// dtype; Copy moves bytes between equal dtypes and converts between float dtypes; CopyColumns
// moves bytes of any 2- or 4-byte dtype; AddColumns widens its 16-bit rows a block at a time
// on the stack (kernels/cpu/columns.cc), and AddBiasAndResidual and the vocabulary-parallel
// cross-entropy widen a row at a time, outside the adapter; Dequantize reads a U8 blob
// (kernels/quant.h) and writes fp32, bf16 or fp16 directly (kernels/cpu/dequantize.cc), outside
// the adapter too. An undefined parameter gradient
// is skipped (Note [Frozen parameters] in ops.h): the adapter passes it through untouched.
// Shapes are checked before any work starts, so a throwing op has written nothing.
// Thread safety: one thread at a time per object (ops.h); each op runs OpenMP-parallel inside
// and never calls OpenBLAS or oneDNN from within a parallel region (Note [BLAS and OpenMP]).
// Every reduction these kernels do themselves (bias, LayerNorm and RMSNorm parameter gradients,
// embedding gradients, SumSquares, attention) is deterministic: its summation order depends
// on the shapes only, never on the number of threads. GEMMs are OpenBLAS's or oneDNN's.
//
// Note [BLAS and OpenMP]: the OpenMP build of OpenBLAS (and Debian's oneDNN, built on the same
// libgomp) runs its threads in the same OpenMP pool as our loops. Calling sgemm inside a
// parallel region would nest pools and run serial at best, so GEMMs and elementwise fix-ups
// (bias add, column sums, dtype conversions) are separate steps.
#include <memory>

#include "kernels/cpu/widen.h"
#include "kernels/ops.h"

namespace ztrain::kernels {
namespace cpu {
class OneDnnMatmul;
}  // namespace cpu

// How a CpuOps runs GEMMs whose two operands are bf16 (Note [bf16 GEMMs] in gemm_mixed.cc).
enum class Bf16GemmPath {
  kAuto,   // oneDNN where the build and the CPU have it and ZTRAIN_ONEDNN is not 0, else SGEMM
  kSgemm,  // OpenBLAS SGEMM on widened copies of the operands (the fallback, forced)
};

class CpuOps final : public Ops {
 public:
  explicit CpuOps(Bf16GemmPath bf16_gemm = Bf16GemmPath::kAuto);
  ~CpuOps() override;
  CpuOps(const CpuOps&) = delete;
  CpuOps& operator=(const CpuOps&) = delete;

  Device device() const override { return Device::Cpu(); }

  // Whether this object's bf16 x bf16 GEMMs run on oneDNN. Decided on the first such GEMM
  // (or the first call of this), which logs the choice once, with the reason for a fallback.
  bool Bf16GemmsOnOneDnn();
  // Bytes of fp32 scratch the widening adapter holds (Note [Widening adapter]).
  int64_t ScratchBytes() const override { return static_cast<int64_t>(scratch_.bytes()); }
  void UseGemmPlan(const GemmPlan& plan) override { gemm_plan_ = plan; }

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
  void MergeAttention(const Tensor& out, const Tensor& lse, const Tensor& part,
                      const Tensor& part_lse) override;
  void AttentionDecode(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                       const AttentionHeads& heads, const Tensor& out) override;
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
  void Synchronize() override {}

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

 private:
  // c[M,N] = alpha op(a) op(b) + bias[N] (when defined) + beta c on 2-D tensors of any float
  // dtypes, shapes already checked; scratch comes from w, which the caller commits.
  void MixedGemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                 const Tensor& bias, float beta, const Tensor& c, cpu::Widened& w, const char* op);
  // SoftmaxCrossEntropy with 16-bit logits, arguments checked (cross_entropy.cc).
  void HalfSoftmaxCrossEntropy(const Tensor& logits, const Tensor& targets, int64_t vocab,
                               const Tensor& losses, const Tensor& dlosses);
  // LinearBackward with any 16-bit argument (gemm_mixed.cc).
  void MixedLinearBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                           const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                           const char* op);

  Bf16GemmPath bf16_gemm_;
  bool bf16_path_decided_ = false;
  std::unique_ptr<cpu::OneDnnMatmul> onednn_;  // set when bf16 GEMMs run on oneDNN
  cpu::ScratchPool scratch_;
  GemmPlan gemm_plan_;  // which backend each fp32 GEMM shape runs on
};

}  // namespace ztrain::kernels
