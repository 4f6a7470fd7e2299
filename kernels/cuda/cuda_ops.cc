#include "kernels/cuda/cuda_ops.h"

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace ztrain::kernels {
namespace cuda {

using ::ztrain::detail::StrCat;

void ThrowCudaError(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(StrCat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ",
                     call, " at ", file, ":", line));
}

void ThrowCublasError(cublasStatus_t status, const char* call, const char* file, int line) {
  throw Error(StrCat("cuBLAS error ", cublasGetStatusName(status), " (",
                     cublasGetStatusString(status), ") in ", call, " at ", file, ":", line));
}

CudaOps::CudaOps(int device, const CudaOpsOptions& options) : device_(device), options_(options) {
  int count = 0;
  ZTRAIN_CUDA_CHECK(cudaGetDeviceCount(&count));
  ZTRAIN_CHECK(device >= 0 && device < count, "CUDA device ", device, " does not exist: ", count,
               " visible (CUDA_VISIBLE_DEVICES)");
  ZTRAIN_CUDA_CHECK(cudaSetDevice(device));
  ZTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault));
  ZTRAIN_CUBLAS_CHECK(cublasCreate(&cublas_));
  ZTRAIN_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  ZTRAIN_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
}

CudaOps::~CudaOps() {
  // Destructors must not throw: errors here are ignored (the device may be gone).
  if (copy_stream_) cudaStreamSynchronize(copy_stream_);
  for (const auto& [ticket, done] : copies_) cudaEventDestroy(done);
  if (issued_) cudaEventDestroy(issued_);
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  if (workspace_) cudaFreeAsync(workspace_, stream_);
  if (stream_) scratch_.Free(stream_);
  if (stream_) cudaStreamSynchronize(stream_);
  if (cublaslt_) cublasLtDestroy(cublaslt_);
  if (cublas_) cublasDestroy(cublas_);
  if (stream_) cudaStreamDestroy(stream_);
}

void* CudaOps::Workspace(size_t bytes) {
  if (bytes <= workspace_bytes_) return workspace_;
  if (workspace_) ZTRAIN_CUDA_CHECK(cudaFreeAsync(workspace_, stream_));
  workspace_ = nullptr;
  workspace_bytes_ = 0;
  ZTRAIN_CUDA_CHECK(cudaMallocAsync(&workspace_, bytes, stream_));
  workspace_bytes_ = bytes;
  return workspace_;
}

}  // namespace cuda

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

CudaDeviceInfo GetCudaDeviceInfo(int device) {
  cudaDeviceProp prop{};
  const cudaError_t rc = cudaGetDeviceProperties(&prop, device);
  if (rc != cudaSuccess) cudaGetLastError();
  ZTRAIN_CHECK(rc == cudaSuccess, "CUDA device ", device,
               " cannot be queried: ", cudaGetErrorString(rc));
  return {prop.major, prop.minor, static_cast<int64_t>(prop.totalGlobalMem), prop.name};
}

std::unique_ptr<Ops> MakeCudaOps(int device, const CudaOpsOptions& options) {
  return std::make_unique<cuda::CudaOps>(device, options);
}

}  // namespace ztrain::kernels
