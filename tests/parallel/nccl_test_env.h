#pragma once
// What the NCCL tests share: the communicators made in nccl_test_main.cc (which runs every
// TEST on every rank in the same order), a fixture that skips without a usable GPU, and
// device buffers filled from and read back into host vectors. Test code only: it includes
// cuda_runtime.h, which library headers never do.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/comm/communicator.h"

namespace ztrain::comm::test {

// The MPI world (host memory): coordinates ranks around a deliberate failure.
Communicator& MpiWorld();
// The NCCL world over MpiWorld(), or null when no usable GPU is visible (SkipReason() says
// why) or creating it failed (CreateError() says how).
Communicator* NcclWorld();
int Device();  // the CUDA device of this rank's NCCL world
const std::string& SkipReason();
const std::string& CreateError();

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CreateError().empty()) FAIL() << "the NCCL world was not created: " << CreateError();
    if (NcclWorld() == nullptr) GTEST_SKIP() << SkipReason();
  }
};

#define ZTRAIN_TEST_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// Device memory of `n` elements of T on the current device, copied from and to host vectors
// with (synchronous) cudaMemcpy.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : n_(host.size()) {
    if (cudaMalloc(&data_, Bytes()) != cudaSuccess) throw Error("cudaMalloc failed in a test");
    Upload(host);
  }
  ~DeviceVector() { (void)cudaFree(data_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;

  void Upload(const std::vector<T>& host) {
    if (host.size() != n_ ||
        cudaMemcpy(data_, host.data(), Bytes(), cudaMemcpyHostToDevice) != cudaSuccess) {
      throw Error("upload failed in a test");
    }
  }
  std::vector<T> ToHost() const {
    std::vector<T> host(n_);
    if (cudaMemcpy(host.data(), data_, Bytes(), cudaMemcpyDeviceToHost) != cudaSuccess) {
      throw Error("download failed in a test");
    }
    return host;
  }
  Tensor tensor(DType dtype) const {
    return Tensor(data_, dtype, {static_cast<int64_t>(n_)}, Device::Cuda(Device()));
  }
  // Elements [offset, offset + count) as a tensor (for in-place ops).
  Tensor Part(DType dtype, int64_t offset, int64_t count) const {
    return tensor(dtype).Flat(offset, {count});
  }

 private:
  size_t Bytes() const { return n_ * sizeof(T); }
  T* data_ = nullptr;
  size_t n_;
};

}  // namespace ztrain::comm::test
