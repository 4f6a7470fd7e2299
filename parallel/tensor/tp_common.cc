#include "parallel/tensor/tp_common.h"

#include <vector>

#include "core/error.h"
#include "kernels/cpu/convert.h"
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

void LoadElements(const Tensor& t, int64_t begin, int64_t count, float* out) {
  const size_t offset = static_cast<size_t>(begin) * DTypeSize(t.dtype());
  kernels::cpu::WidenSerial(static_cast<const char*>(t.data()) + offset, t.dtype(), out, count);
}

void StoreElements(const float* in, const Tensor& t, int64_t begin, int64_t count) {
  const size_t offset = static_cast<size_t>(begin) * DTypeSize(t.dtype());
  kernels::cpu::NarrowSerial(in, static_cast<char*>(t.data()) + offset, t.dtype(), count);
}

Tensor Fp32Partial(const nn::LayerContext& ctx, const Tensor& out, Buffer& hold) {
  if (out.dtype() == DType::kF32) return out;
  hold = Buffer(ctx.allocator(), DType::kF32, out.shape(), MemoryCategory::kWorkspace);
  return hold.AsTensor(DType::kF32, out.shape());
}

void AddBiasAndResidual(const Tensor& sum, const Tensor& bias, const Tensor& residual,
                        const Tensor& y) {
  const int64_t c = bias.numel(), rows = y.numel() / c;
  ZTRAIN_ASSERT(sum.dtype() == DType::kF32 && sum.numel() == y.numel() && y.numel() == rows * c &&
                    residual.numel() == y.numel(),
                "sum ", ShapeToString(sum.shape()), ", bias ", ShapeToString(bias.shape()),
                " and residual ", ShapeToString(residual.shape()), " do not fit ",
                ShapeToString(y.shape()));
  std::vector<float> b(static_cast<size_t>(c));
  LoadElements(bias, 0, c, b.data());
  const float* s = sum.data<float>();
#pragma omp parallel if (rows * c >= kParallelGrain)
  {
    std::vector<float> row(static_cast<size_t>(c));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      LoadElements(residual, i * c, c, row.data());
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) row[j] = s[i * c + j] + (b[j] + row[j]);
      StoreElements(row.data(), y, i * c, c);
    }
  }
}

void LinearBackwardAllReduceDx(nn::LayerContext& ctx, comm::Communicator& tp, const Tensor& dy,
                               const Tensor& x, const Tensor& weight, const Tensor& dx,
                               const Tensor& dweight, const Tensor& dbias) {
  kernels::Ops& ops = ctx.ops();
  // Backward workspace lives until the context's Release, as the layers' other scratch.
  const Tensor sum = dx.dtype() == DType::kF32 ? dx : ctx.Scratch(DType::kF32, dx.shape());
  ops.Gemm(false, false, 1.0f, dy, weight, 0.0f, sum);  // dx[N,C] = dy[N,OC] @ weight[OC,C]
  const comm::WorkPtr work = tp.AllReduce(sum);
  ops.LinearBackward(dy, x, weight, Tensor(), dweight, dbias);  // reads neither dx nor its sum
  work->Wait();
  if (sum.data() != dx.data()) ops.Copy(sum, dx);
}

}  // namespace ztrain::tensor::detail
