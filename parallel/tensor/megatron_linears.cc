// MegatronLinears' column- and row-parallel linears (Note [Megatron f and g] in
// megatron_linears.h), and the model built on them.
#include "parallel/tensor/megatron_linears.h"

#include "core/error.h"
#include "parallel/tensor/tp_common.h"

namespace ztrain::tensor {

void MegatronLinears::ColumnBackward(nn::LayerContext& ctx,
                                     std::span<const nn::LinearGrad> linears, const Tensor& x,
                                     const Tensor& dx) const {
  kernels::Ops& ops = ctx.ops();
  // Backward workspace lives until the context's Release, as the layers' other scratch.
  const Tensor sum = dx.dtype() == DType::kF32 ? dx : ctx.Scratch(DType::kF32, dx.shape());
  float beta = 0.0f;
  for (const nn::LinearGrad& l : linears) {  // dx[N,C] = sum of dy[N,OC] @ weight[OC,C]
    ops.Gemm(false, false, 1.0f, l.dy, l.weight, beta, sum);
    beta = 1.0f;
  }
  const comm::WorkPtr work = tp_.AllReduce(sum);
  // Reads neither dx nor its sum; skips an undefined (frozen) dweight or dbias (Note [Frozen
  // parameters] in kernels/ops.h).
  for (const nn::LinearGrad& l : linears) {
    if (l.dweight.defined() || l.dbias.defined()) {
      ops.LinearBackward(l.dy, x, l.weight, Tensor(), l.dweight, l.dbias);
    }
  }
  work->Wait();
  if (sum.data() != dx.data()) ops.Copy(sum, dx);
}

void MegatronLinears::RowForward(nn::LayerContext& ctx, const Tensor& x, const Tensor& weight,
                                 const Tensor& bias, const Tensor& residual,
                                 const Tensor& y) const {
  // The partial sums in fp32 (Note [Tensor parallelism in 16 bits]): y itself when it is.
  Buffer hold;
  const Tensor sum = detail::Fp32Partial(ctx, y, hold);
  ctx.ops().LinearForward(x, weight, Tensor(), sum);
  tp_.AllReduce(sum)->Wait();
  ctx.ops().AddBiasAndResidual(sum, bias, residual, y);
}

std::shared_ptr<const nn::LinearProvider> MakeLinears(comm::Communicator& tp) {
  if (tp.size() == 1) return nn::MakeWholeLinears();
  return std::make_shared<const MegatronLinears>(tp);
}

nn::LayerList BuildParallelModel(const ModelConfig& model, comm::Communicator& tp,
                                 const nn::AdapterPlan& plan) {
  return nn::BuildModel(model, MakeLinears(tp), plan);
}

void MegatronLinears::SumOverPieces(nn::LayerContext&, const Tensor& t) const {
  ZTRAIN_ASSERT(t.dtype() == DType::kF32, "tensor-parallel sums are fp32");
  tp_.AllReduce(t)->Wait();
}

}  // namespace ztrain::tensor
