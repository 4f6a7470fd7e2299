#pragma once
// Error checks for the CUDA backend (private to kernels/cuda): every CUDA runtime and cuBLAS
// call goes through one of these, so a failure throws ztrain::Error naming the call, the
// error and where it happened, never a silent wrong result.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

namespace ztrain::kernels::cuda {

[[noreturn]] void ThrowCudaError(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void ThrowCublasError(cublasStatus_t status, const char* call, const char* file,
                                   int line);

}  // namespace ztrain::kernels::cuda

#define ZTRAIN_CUDA_CHECK(call)                                                         \
  do {                                                                                  \
    const cudaError_t ztrain_err_ = (call);                                             \
    if (ztrain_err_ != cudaSuccess) {                                                   \
      ::ztrain::kernels::cuda::ThrowCudaError(ztrain_err_, #call, __FILE__, __LINE__); \
    }                                                                                   \
  } while (0)

#define ZTRAIN_CUBLAS_CHECK(call)                                                         \
  do {                                                                                    \
    const cublasStatus_t ztrain_st_ = (call);                                             \
    if (ztrain_st_ != CUBLAS_STATUS_SUCCESS) {                                            \
      ::ztrain::kernels::cuda::ThrowCublasError(ztrain_st_, #call, __FILE__, __LINE__); \
    }                                                                                     \
  } while (0)

// After a kernel launch: the launch's own error (bad configuration), not the kernel's result.
#define ZTRAIN_CUDA_CHECK_LAUNCH() ZTRAIN_CUDA_CHECK(cudaGetLastError())
