#pragma once
// CpuOps: the op set on the host (OpenBLAS for GEMMs, OpenMP + vectorised loops for the rest).
//
// Owns nothing: every op works on caller-owned Tensors. Only fp32 is implemented; any other
// dtype throws ztrain::Error naming it (Zero and Copy move bytes and take every dtype).
// Shapes are checked before any work starts, so a throwing op has written nothing.
// Thread safety: one thread at a time per object (ops.h); each op runs OpenMP-parallel inside
// and never calls OpenBLAS from within a parallel region (Note [BLAS and OpenMP]).
// Every reduction these kernels do themselves (bias and LayerNorm parameter gradients,
// embedding gradients, SumSquares, attention) is deterministic: its summation order depends
// on the shapes only, never on the number of threads. GEMMs are OpenBLAS's.
//
// Note [BLAS and OpenMP]: the OpenMP build of OpenBLAS runs its threads in the same OpenMP
// pool as our loops. Calling sgemm inside a parallel region would nest pools and run serial
// at best, so GEMMs and elementwise fix-ups (bias add, column sums) are separate steps.
#include "kernels/ops.h"

namespace ztrain::kernels {

class CpuOps final : public Ops {
 public:
  Device device() const override { return Device::Cpu(); }

  void Gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
            float beta, const Tensor& c) override;
  void LinearForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                     const Tensor& y) override;
  void LinearBackward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& dx,
                      const Tensor& dweight, const Tensor& dbias) override;

  void EmbeddingForward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                        const Tensor& out) override;
  void EmbeddingBackward(const Tensor& dout, const Tensor& tokens, const Tensor& dwte,
                         const Tensor& dwpe) override;

  void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Tensor& y, const Tensor& mean, const Tensor& rstd) override;
  void LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                         const Tensor& dweight, const Tensor& dbias) override;

  void AttentionForward(const Tensor& qkv, int num_heads, const Tensor& out,
                        const Tensor& lse) override;
  void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                         const Tensor& lse, int num_heads, const Tensor& dqkv) override;

  void GeluForward(const Tensor& x, const Tensor& y) override;
  void GeluBackward(const Tensor& dy, const Tensor& x, const Tensor& dx) override;

  void Add(const Tensor& a, const Tensor& b, const Tensor& y) override;
  void AddInPlace(const Tensor& y, const Tensor& x) override;
  void Zero(const Tensor& t) override;
  void Copy(const Tensor& src, const Tensor& dst) override;
  void Synchronize() override {}

  void SoftmaxCrossEntropy(const Tensor& logits, const Tensor& targets, int64_t vocab,
                           const Tensor& losses, const Tensor& dlosses) override;

  double SumSquares(const Tensor& t) override;
  void Scale(const Tensor& t, float alpha) override;
};

}  // namespace ztrain::kernels
