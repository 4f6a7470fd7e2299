#include "parallel/tensor/tp_common.h"

#include <vector>

#include "core/error.h"
#include "kernels/cpu/convert.h"
#include "nn/layer_context.h"

namespace ztrain::tensor::detail {

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
  const int64_t c = y.size(-1), rows = y.numel() / c;
  ZTRAIN_ASSERT(sum.dtype() == DType::kF32 && sum.numel() == y.numel() &&
                    (!bias.defined() || bias.numel() == c) && residual.numel() == y.numel(),
                "sum ", ShapeToString(sum.shape()), ", bias ", ShapeToString(bias.shape()),
                " and residual ", ShapeToString(residual.shape()), " do not fit ",
                ShapeToString(y.shape()));
  std::vector<float> b(static_cast<size_t>(c), 0.0f);
  if (bias.defined()) LoadElements(bias, 0, c, b.data());
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

}  // namespace ztrain::tensor::detail
