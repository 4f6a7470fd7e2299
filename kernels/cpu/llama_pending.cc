// TEMPORARY (branch llama-ops only): stubs until the CPU Llama ops exist.
#include "kernels/cpu/cpu_ops.h"
#include "kernels/pending_llama_ops.h"

namespace ztrain::kernels {
#define ZTRAIN_PENDING(name) ZTRAIN_CHECK(false, #name " is not implemented yet")
void CpuOps::RmsNormForward(const Tensor&, const Tensor&, float, const Tensor&, const Tensor&) {
  ZTRAIN_PENDING(RmsNormForward);
}
void CpuOps::RmsNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const Tensor&) {
  ZTRAIN_PENDING(RmsNormBackward);
}
void CpuOps::RopeForward(const Tensor&, const AttentionHeads&, const Tensor&) {
  ZTRAIN_PENDING(RopeForward);
}
void CpuOps::RopeBackward(const Tensor&, const AttentionHeads&, const Tensor&) {
  ZTRAIN_PENDING(RopeBackward);
}
void CpuOps::SwiGluForward(const Tensor&, const Tensor&, const Tensor&) {
  ZTRAIN_PENDING(SwiGluForward);
}
void CpuOps::SwiGluBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&) {
  ZTRAIN_PENDING(SwiGluBackward);
}
}  // namespace ztrain::kernels
