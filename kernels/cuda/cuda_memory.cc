#include "kernels/cuda_memory.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace ztrain::kernels {
namespace {

class CudaAllocator final : public Allocator {
 public:
  CudaAllocator(int device, MemoryTracker* tracker, cudaStream_t stream)
      : device_(device), tracker_(tracker), stream_(stream) {
    int count = 0;
    ZTRAIN_CUDA_CHECK(cudaGetDeviceCount(&count));
    ZTRAIN_CHECK(device >= 0 && device < count, "CUDA device ", device, " does not exist: ",
                 count, " visible (CUDA_VISIBLE_DEVICES)");
    cudaMemPool_t pool = nullptr;
    ZTRAIN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    // Keep freed blocks in the pool instead of returning them at every synchronisation.
    uint64_t keep = std::numeric_limits<uint64_t>::max();
    ZTRAIN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }

  void* Allocate(size_t bytes, MemoryCategory category) override {
    if (bytes == 0) return nullptr;
    ZTRAIN_CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    const cudaError_t err = cudaMallocAsync(&p, bytes, stream_);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw OutOfMemoryError(::ztrain::detail::StrCat(
          "out of memory on CUDA device ", device_, " allocating ",
          FormatBytes(static_cast<int64_t>(bytes)), " for ", MemoryCategoryName(category),
          "; lower the micro-batch, use ZeRO stage 2/3 or offload, or see `ztrain estimate`"));
    }
    ZTRAIN_CUDA_CHECK(err);
    if (tracker_) tracker_->Allocated(category, static_cast<int64_t>(bytes));
    return p;
  }

  void Free(void* ptr, size_t bytes, MemoryCategory category) noexcept override {
    if (ptr == nullptr) return;
    cudaSetDevice(device_);
    cudaFreeAsync(ptr, stream_);  // an error here cannot be reported from a noexcept Free
    if (tracker_) tracker_->Freed(category, static_cast<int64_t>(bytes));
  }

  Device device() const override { return Device::Cuda(device_); }
  MemoryTracker* tracker() const override { return tracker_; }

 private:
  int device_;
  MemoryTracker* tracker_;
  cudaStream_t stream_;
};

class CudaPinnedAllocator final : public Allocator {
 public:
  explicit CudaPinnedAllocator(MemoryTracker* tracker) : tracker_(tracker) {}

  void* Allocate(size_t bytes, MemoryCategory category) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw OutOfMemoryError(::ztrain::detail::StrCat(
          "out of pinned host memory allocating ", FormatBytes(static_cast<int64_t>(bytes)),
          " for ", MemoryCategoryName(category), "; set pin_memory false or offload less"));
    }
    ZTRAIN_CUDA_CHECK(err);
    if (tracker_) tracker_->Allocated(category, static_cast<int64_t>(bytes));
    return p;
  }

  void Free(void* ptr, size_t bytes, MemoryCategory category) noexcept override {
    if (ptr == nullptr) return;
    cudaFreeHost(ptr);
    if (tracker_) tracker_->Freed(category, static_cast<int64_t>(bytes));
  }

  Device device() const override { return Device::Cpu(); }
  MemoryTracker* tracker() const override { return tracker_; }

 private:
  MemoryTracker* tracker_;
};

}  // namespace

std::unique_ptr<Allocator> MakeCudaAllocator(int device, MemoryTracker* tracker, void* stream) {
  return std::make_unique<CudaAllocator>(device, tracker, static_cast<cudaStream_t>(stream));
}

std::unique_ptr<Allocator> MakeCudaPinnedAllocator(MemoryTracker* tracker) {
  return std::make_unique<CudaPinnedAllocator>(tracker);
}

}  // namespace ztrain::kernels
