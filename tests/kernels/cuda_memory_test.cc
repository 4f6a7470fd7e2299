// CUDA device and pinned host memory (kernels/cuda_memory.h): allocations are usable, counted
// by the MemoryTracker under their category and released; an impossible size is an
// OutOfMemoryError naming the device. Skips without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cuda_memory.h"
#include "kernels/ops.h"

namespace ztrain::kernels {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible"

TEST(CudaMemoryTest, DeviceMemoryIsCountedAndHoldsData) {
  SKIP_WITHOUT_GPU();
  MemoryTracker tracker;
  auto alloc = MakeCudaAllocator(0, &tracker);
  EXPECT_EQ(alloc->device(), Device::Cuda(0));
  const size_t n = 1 << 20;
  void* p = alloc->Allocate(n, MemoryCategory::kActivations);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(tracker.Current(MemoryCategory::kActivations), static_cast<int64_t>(n));
  std::vector<unsigned char> host(n, 0);
  ASSERT_EQ(cudaMemset(p, 0xab, n), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host[0], 0xab);
  EXPECT_EQ(host[n - 1], 0xab);
  alloc->Free(p, n, MemoryCategory::kActivations);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(tracker.Current(MemoryCategory::kActivations), 0);
  EXPECT_EQ(tracker.Peak(MemoryCategory::kActivations), static_cast<int64_t>(n));
}

TEST(CudaMemoryTest, ExhaustedDeviceIsANamedOutOfMemoryError) {
  SKIP_WITHOUT_GPU();
  MemoryTracker tracker;
  auto alloc = MakeCudaAllocator(0, &tracker);
  try {
    alloc->Allocate(size_t{1} << 50, MemoryCategory::kParameters);  // 1 PiB
    FAIL() << "a 1 PiB allocation succeeded";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA device 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("parameters"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tracker.Current(MemoryCategory::kParameters), 0);
}

TEST(CudaMemoryTest, PinnedHostMemoryIsPageLockedAndCounted) {
  SKIP_WITHOUT_GPU();
  MemoryTracker tracker;
  auto alloc = MakeCudaPinnedAllocator(&tracker);
  const size_t n = 1 << 16;
  void* p = alloc->Allocate(n, MemoryCategory::kOptimizerState);
  std::memset(p, 7, n);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, p), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  EXPECT_EQ(tracker.Current(MemoryCategory::kOptimizerState), static_cast<int64_t>(n));
  alloc->Free(p, n, MemoryCategory::kOptimizerState);
  EXPECT_EQ(tracker.Current(MemoryCategory::kOptimizerState), 0);
}

TEST(CudaMemoryTest, AMissingDeviceIsNamed) {
  SKIP_WITHOUT_GPU();
  MemoryTracker tracker;
  try {
    MakeCudaAllocator(CudaDeviceCount(), &tracker);
    FAIL() << "an allocator for a missing device was made";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ztrain::kernels
