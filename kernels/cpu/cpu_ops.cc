#include "kernels/cpu/cpu_ops.h"

#include <memory>

namespace ztrain::kernels {

std::unique_ptr<Ops> MakeCpuOps() { return std::make_unique<CpuOps>(); }

}  // namespace ztrain::kernels
