// MegatronLinears' column- and row-parallel linears (Note [Megatron f and g] in
// megatron_linears.h), and the model built on them.
#include "parallel/tensor/megatron_linears.h"

#include "core/error.h"
#include "parallel/context_group.h"
#include "parallel/tensor/tp_common.h"

namespace ztrain::tensor {

void MegatronLinears::ColumnBackward(nn::LayerContext& ctx,
                                     std::span<const nn::LinearGrad> linears, const Tensor& x,
                                     const Tensor& dx) const {
  kernels::Ops& ops = ctx.ops();
  // Backward workspace lives until the context's Release, as the layers' other scratch. Under
  // sequence parallelism dx holds this rank's rows of the sum (Note [Sequence parallelism]).
  const bool scatter = dx.size(0) != x.size(0);
  ZTRAIN_ASSERT(!scatter || dx.size(0) * tp_.size() == x.size(0), "dx rows ", dx.size(0),
                " for x rows ", x.size(0));
  const Tensor local = dx.dtype() == DType::kF32 ? dx : ctx.Scratch(DType::kF32, dx.shape());
  const Tensor sum = scatter ? ctx.Scratch(DType::kF32, {x.size(0), dx.size(1)}) : local;
  float beta = 0.0f;
  for (const nn::LinearGrad& l : linears) {  // dx[N,C] = sum of dy[N,OC] @ weight[OC,C]
    ops.Gemm(false, false, 1.0f, l.dy, l.weight, beta, sum);
    beta = 1.0f;
  }
  const comm::WorkPtr work = scatter ? tp_.ReduceScatter(sum, local) : tp_.AllReduce(sum);
  // Reads neither dx nor its sum; skips an undefined (frozen) dweight or dbias (Note [Frozen
  // parameters] in kernels/ops.h).
  for (const nn::LinearGrad& l : linears) {
    if (l.dweight.defined() || l.dbias.defined()) {
      ops.LinearBackward(l.dy, x, l.weight, Tensor(), l.dweight, l.dbias);
    }
  }
  work->Wait();
  if (local.data() != dx.data()) ops.Copy(local, dx);
}

void MegatronLinears::RowForward(nn::LayerContext& ctx, const Tensor& x, const Tensor& weight,
                                 const Tensor& bias, const Tensor& residual,
                                 const Tensor& y) const {
  // The partial sums in fp32 (Note [Tensor parallelism in 16 bits]): y itself when it is.
  Buffer hold;
  const Tensor sum = detail::Fp32Partial(ctx, y, hold);
  if (y.size(0) == x.size(0)) {
    ctx.ops().LinearForward(x, weight, Tensor(), sum);
    tp_.AllReduce(sum)->Wait();
  } else {  // Note [Sequence parallelism]: this rank's rows of the sum
    ZTRAIN_ASSERT(y.size(0) * tp_.size() == x.size(0), "y rows ", y.size(0), " for x rows ",
                  x.size(0));
    Buffer whole(ctx.allocator(), DType::kF32, {x.size(0), y.size(1)}, MemoryCategory::kWorkspace);
    const Tensor partial = whole.AsTensor(DType::kF32, {x.size(0), y.size(1)});
    ctx.ops().LinearForward(x, weight, Tensor(), partial);
    tp_.ReduceScatter(partial, sum)->Wait();
  }
  ctx.ops().AddBiasAndResidual(sum, bias, residual, y);
}

void MegatronLinears::GatherRows(nn::LayerContext&, const Tensor& local,
                                 const Tensor& whole) const {
  ZTRAIN_ASSERT(local.dtype() == whole.dtype() && local.numel() * tp_.size() == whole.numel());
  tp_.AllGather(local, whole)->Wait();
}

std::shared_ptr<const nn::LinearProvider> MakeLinears(comm::Communicator& tp,
                                                      bool sequence_parallel,
                                                      comm::Communicator* cp,
                                                      nn::ContextAlgorithm algorithm) {
  if (tp.size() == 1) return nn::MakeWholeLinears(MakeContextGroup(cp, algorithm));
  return std::make_shared<const MegatronLinears>(tp, sequence_parallel,
                                                 MakeContextGroup(cp, algorithm));
}

nn::LayerList BuildParallelModel(const ModelConfig& model, comm::Communicator& tp,
                                 const nn::AdapterPlan& plan, bool sequence_parallel,
                                 comm::Communicator* cp, nn::ContextAlgorithm algorithm) {
  return nn::BuildModel(model, MakeLinears(tp, sequence_parallel, cp, algorithm), plan);
}

void MegatronLinears::SumOverPieces(nn::LayerContext&, const Tensor& t) const {
  ZTRAIN_ASSERT(t.dtype() == DType::kF32, "tensor-parallel sums are fp32");
  tp_.AllReduce(t)->Wait();
}

}  // namespace ztrain::tensor
