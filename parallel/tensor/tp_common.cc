#include "parallel/tensor/tp_common.h"

#include "nn/layer_context.h"

namespace ztrain::tensor::detail {

Tensor Fp32Partial(const nn::LayerContext& ctx, const Tensor& out, Buffer& hold) {
  if (out.dtype() == DType::kF32) return out;
  hold = Buffer(ctx.allocator(), DType::kF32, out.shape(), MemoryCategory::kWorkspace);
  return hold.AsTensor(DType::kF32, out.shape());
}

}  // namespace ztrain::tensor::detail
