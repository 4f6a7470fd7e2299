// TEMPORARY (branch llama-ops only): stubs until the CUDA Llama ops exist.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/pending_llama_ops.h"

namespace ztrain::kernels::cuda {
using kernels::AttentionHeads;
#define ZTRAIN_PENDING(name) ZTRAIN_CHECK(false, #name " is not implemented yet")
void CudaOps::RopeForward(const Tensor&, const AttentionHeads&, const Tensor&) {
  ZTRAIN_PENDING(RopeForward);
}
void CudaOps::RopeBackward(const Tensor&, const AttentionHeads&, const Tensor&) {
  ZTRAIN_PENDING(RopeBackward);
}
void CudaOps::SwiGluForward(const Tensor&, const Tensor&, const Tensor&) {
  ZTRAIN_PENDING(SwiGluForward);
}
void CudaOps::SwiGluBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&) {
  ZTRAIN_PENDING(SwiGluBackward);
}
}  // namespace ztrain::kernels
