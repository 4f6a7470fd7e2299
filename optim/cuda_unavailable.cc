// The CUDA AdamStep in a build without CUDA (as kernels/cuda_unavailable.cc).
#include "core/error.h"
#include "optim/cuda/adam_cuda.h"

namespace ztrain::optim::detail {

void AdamStepCuda(kernels::Ops&, const AdamKernelArgs&, const Tensor& param, const Tensor&,
                  const Tensor&, const Tensor&, const Tensor&) {
  ZTRAIN_CHECK(false, "AdamStep: the tensors are on ", param.device().ToString(),
               ", but this build has no CUDA: install the CUDA toolkit and reconfigure with "
               "-DZTRAIN_WITH_CUDA=ON, or keep the optimizer state on the host");
}

}  // namespace ztrain::optim::detail
