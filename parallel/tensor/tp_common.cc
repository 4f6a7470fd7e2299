#include "parallel/tensor/tp_common.h"

#include "core/error.h"
#include "nn/layer_context.h"

namespace ztrain::tensor::detail {

nn::ParamSpec Split(nn::ParamSpec spec, int dim, int groups, const comm::Communicator& tp) {
  if (tp.size() == 1) return spec;
  auto& d = spec.shape.at(static_cast<size_t>(dim));
  ZTRAIN_ASSERT(d % (static_cast<int64_t>(groups) * tp.size()) == 0, spec.name, " dimension ", dim,
                " of ", ShapeToString(spec.shape), " does not split into ", groups, " x ",
                tp.size());
  spec.tp.full_shape = spec.shape;
  spec.tp.dim = dim;
  spec.tp.groups = groups;
  spec.tp.parts = tp.size();
  spec.tp.part = tp.rank();
  d /= tp.size();
  return spec;
}

std::string DivisibilityProblem(const char* key, int64_t value, int tp_size, const char* fix) {
  if (tp_size > 0 && value % tp_size == 0) return "";
  return ::ztrain::detail::StrCat(key, " ", value, " does not divide by tensor_parallel.size ",
                                  tp_size, "; ", fix);
}

void CheckDivides(const char* key, int64_t value, int tp_size, const char* fix) {
  const std::string problem = DivisibilityProblem(key, value, tp_size, fix);
  ZTRAIN_CHECK_T(ConfigError, problem.empty(), problem);
}

void CheckHostOps(const nn::LayerContext& ctx, const std::string& layer) {
  ZTRAIN_CHECK(ctx.ops().device().is_cpu(), "tensor-parallel layer ", layer, " runs on ",
               ctx.ops().device().ToString(),
               " ops, but its vocabulary and bias loops are host code; use the CPU backend");
}

void AddBiasAndResidual(const Tensor& y, const Tensor& bias, const Tensor& residual) {
  const int64_t c = bias.numel(), rows = y.numel() / c;
  ZTRAIN_ASSERT(y.numel() == rows * c && residual.numel() == y.numel(), "bias ",
                ShapeToString(bias.shape()), " and residual ", ShapeToString(residual.shape()),
                " do not fit ", ShapeToString(y.shape()));
  float* out = y.data<float>();
  const float* b = bias.data<float>();
  const float* r = residual.data<float>();
#pragma omp parallel for schedule(static) if (rows * c >= kParallelGrain)
  for (int64_t i = 0; i < rows; ++i) {
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) out[i * c + j] += b[j] + r[i * c + j];
  }
}

void LinearBackwardAllReduceDx(nn::LayerContext& ctx, comm::Communicator& tp, const Tensor& dy,
                               const Tensor& x, const Tensor& weight, const Tensor& dx,
                               const Tensor& dweight, const Tensor& dbias) {
  kernels::Ops& ops = ctx.ops();
  ops.Gemm(false, false, 1.0f, dy, weight, 0.0f, dx);  // dx[N,C] = dy[N,OC] @ weight[OC,C]
  const comm::WorkPtr work = tp.AllReduce(dx);
  ops.LinearBackward(dy, x, weight, Tensor(), dweight, dbias);  // reads neither dx nor its sum
  work->Wait();
}

}  // namespace ztrain::tensor::detail
