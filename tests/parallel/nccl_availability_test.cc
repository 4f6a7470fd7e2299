// The NCCL communicator's entry points in one process: what the build and the machine offer,
// and the errors MakeNcclCommunicator gives when it cannot work. Runs everywhere; with a GPU
// it also checks a communicator of one rank (the multi-rank tests need one GPU per rank).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/nccl/nccl_communicator.h"

#if ZTRAIN_TEST_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace ztrain::comm {
namespace {

using std::chrono::seconds;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The error MakeNcclCommunicator throws over a world of one on `device`.
std::string MakeError(int device) {
  auto self = MakeSelfCommunicator();
  try {
    MakeNcclCommunicator(*self, device, seconds(10));
  } catch (const CommError& e) {
    return std::string("CommError: ") + e.what();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(NcclAvailabilityTest, HaveNcclMatchesTheBuild) {
  EXPECT_EQ(HaveNccl(), ZTRAIN_TEST_HAVE_NCCL == 1);
}

TEST(NcclAvailabilityTest, VisibleCudaDevicesMatchesTheRuntimeAndNeverThrows) {
  int visible = -1;
  ASSERT_NO_THROW(visible = VisibleCudaDevices());
  int expected = 0;
#if ZTRAIN_TEST_HAVE_NCCL
  if (cudaGetDeviceCount(&expected) != cudaSuccess) expected = 0;  // no driver or no GPU
#endif
  EXPECT_EQ(visible, expected);
  EXPECT_EQ(VisibleCudaDevices(), visible) << "a second call must not differ";
}

TEST(NcclAvailabilityTest, MakeWithoutNcclOrGpuThrowsAClearError) {
  if (HaveNccl() && VisibleCudaDevices() > 0) {
    GTEST_SKIP() << "a GPU is visible: NcclSingleRankTest covers creation";
  }
  const std::string error = MakeError(0);
  if (!HaveNccl()) {
    EXPECT_TRUE(Contains(error, "built without NCCL; rebuild with -DZTRAIN_WITH_NCCL=ON")) << error;
  } else {
    EXPECT_TRUE(Contains(error, "needs a GPU, but rank 0 sees no CUDA device")) << error;
  }
}

TEST(NcclAvailabilityTest, DeviceOutOfRangeNamesTheVisibleCount) {
  if (!HaveNccl() || VisibleCudaDevices() == 0) GTEST_SKIP() << "no GPU is visible";
  const int visible = VisibleCudaDevices();
  const std::string error = MakeError(visible);
  EXPECT_TRUE(Contains(error, "device " + std::to_string(visible) + " is not one of the " +
                                  std::to_string(visible) + " CUDA devices"))
      << error;
}

#if ZTRAIN_TEST_HAVE_NCCL
// A group of one over the world of one: every collective leaves the data as the reduction
// of one rank, in place and out of place, and moves no bytes.
TEST(NcclSingleRankTest, CollectivesOfOneRankKeepTheData) {
  if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no GPU is visible (no CUDA driver or device)";
  auto self = MakeSelfCommunicator();
  auto nccl = MakeNcclCommunicator(*self, 0, seconds(30));
  EXPECT_EQ(nccl->size(), 1);
  EXPECT_EQ(nccl->name(), "world of 1");
  const std::vector<float> host = {1.5f, -2.0f, 3.0f, 4.0f};
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 2 * host.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  const Tensor t(d, DType::kF32, {4}, Device::Cuda(0));
  const Tensor copy(d + 4, DType::kF32, {4}, Device::Cuda(0));
  nccl->AllReduce(t)->Wait();
  nccl->AllGather(t, copy)->Wait();
  nccl->Barrier()->Wait();
  auto split = nccl->Split(3, 0);
  split->Broadcast(copy, 0)->Wait();
  std::vector<float> got(8);
  ASSERT_EQ(cudaMemcpy(got.data(), d, got.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, (std::vector<float>{1.5f, -2.0f, 3.0f, 4.0f, 1.5f, -2.0f, 3.0f, 4.0f}));
  EXPECT_EQ(nccl->stats().TotalBytes(), 0);
  EXPECT_EQ(split->name(), "group of 1 (world ranks 0)");
  split.reset();
  nccl.reset();
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

// An all-gather from host memory (a ZeRO-3 shard offloaded there, communicator.h): copied
// into the rank's chunk on the communicator's stream after the work issued before it (here a
// fill of the output on the default stream, which a copy run out of order would leave), from
// pinned and from pageable memory; 64 MiB, so the copy takes a while.
TEST(NcclSingleRankTest, AnAllGatherTakesItsInputFromHostMemory) {
  if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no GPU is visible (no CUDA driver or device)";
  auto self = MakeSelfCommunicator();
  auto nccl = MakeNcclCommunicator(*self, 0, seconds(30));
  constexpr int64_t n = int64_t{16} << 20;
  float* pinned = nullptr;
  float* d = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pinned), n * sizeof(float), 0), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
  std::vector<float> pageable(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    pinned[i] = static_cast<float>(i % 1009);
    pageable[static_cast<size_t>(i)] = static_cast<float>(i % 1013);
  }
  const Tensor out(d, DType::kF32, {n}, Device::Cuda(0));
  for (float* host : {pinned, pageable.data()}) {
    ASSERT_EQ(cudaMemsetAsync(d, 0xff, n * sizeof(float), nullptr), cudaSuccess);
    nccl->AllGather(Tensor(host, DType::kF32, {n}), out)->Wait();
    std::vector<float> got(static_cast<size_t>(n));
    ASSERT_EQ(cudaMemcpy(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[static_cast<size_t>(i)], host[i])
          << (host == pinned ? "pinned" : "pageable") << " element " << i;
    }
  }
  nccl.reset();
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

TEST(NcclSingleRankTest, HostMemoryIsRefusedByTheIssuingCall) {
  if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no GPU is visible (no CUDA driver or device)";
  auto self = MakeSelfCommunicator();
  auto nccl = MakeNcclCommunicator(*self, 0, seconds(30));
  std::vector<float> host(4);
  try {
    nccl->AllReduce(Tensor(host.data(), DType::kF32, {4}, Device::Cuda(0)));
    ADD_FAILURE() << "a host pointer labelled cuda:0 was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.what(), "AllReduce: the tensor says cuda:0 but its pointer"))
        << e.what();
    EXPECT_TRUE(Contains(e.what(), "is host memory")) << e.what();
  }
}
#endif

}  // namespace
}  // namespace ztrain::comm
