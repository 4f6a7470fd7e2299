// The CUDA backend's entry points in a build without CUDA.
#include "core/error.h"
#include "kernels/cuda_memory.h"
#include "kernels/ops.h"

namespace ztrain::kernels {

int CudaDeviceCount() { return 0; }

CudaDeviceInfo GetCudaDeviceInfo(int device) {
  ZTRAIN_CHECK(false, "CUDA device ", device, " asked for, but this ztrain was built without CUDA");
  return {};
}

std::unique_ptr<Ops> MakeCudaOps(int device, const CudaOpsOptions& /*options*/) {
  ZTRAIN_CHECK(false, "CUDA device ", device,
               " asked for, but this ztrain was built without "
               "CUDA: install the CUDA toolkit (nvcc, cuBLAS) and reconfigure with "
               "-DZTRAIN_WITH_CUDA=ON");
  return nullptr;
}

namespace {
[[noreturn]] void NotBuilt(const char* what) {
  throw Error(::ztrain::detail::StrCat(what,
                                       " asked for, but this ztrain was built without "
                                       "CUDA: install the CUDA toolkit and reconfigure with "
                                       "-DZTRAIN_WITH_CUDA=ON"));
}
}  // namespace

std::unique_ptr<Allocator> MakeCudaAllocator(int, MemoryTracker*, void*) {
  NotBuilt("CUDA device memory");
}

std::unique_ptr<Allocator> MakeCudaPinnedAllocator(MemoryTracker*) {
  NotBuilt("CUDA pinned host memory");
}

}  // namespace ztrain::kernels
