// main() of the multi-rank NCCL tests: an MPI world, an NCCL world over it when every rank
// has a GPU of its own, GoogleTest output from rank 0 only (plus every failure on any rank).
// Exits with kSkipped when every test was skipped, so CTest reports the entry as skipped
// rather than passed on a machine without GPUs.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "parallel/comm/mpi/mpi_communicator.h"
#include "parallel/comm/nccl/nccl_communicator.h"
#include "parallel/launch_env.h"
#include "tests/parallel/nccl_test_env.h"
#include "tests/parallel/rank_output.h"

namespace ztrain::comm::test {
namespace {

constexpr int kSkipped = 77;  // SKIP_RETURN_CODE in tests/parallel/CMakeLists.txt

std::unique_ptr<Communicator> mpi_world;
std::unique_ptr<Communicator> nccl_world;
int device = -1;
std::string skip_reason;
std::string create_error;

// Why this rank cannot run the tests, or "" when it can. NCCL refuses two ranks of one
// communicator on one GPU, so each rank on a node needs its own.
std::string WhyNoGpu(const LaunchEnv& env) {
  const int visible = VisibleCudaDevices();
  if (!HaveNccl()) return "this build has no NCCL";
  if (visible == 0) return "no GPU is visible (no CUDA driver or device): NCCL tests skipped";
  if (visible < env.local_size) {
    return detail::StrCat(env.local_size, " ranks share this node but only ", visible,
                          " CUDA device(s) are visible; NCCL needs one GPU per rank");
  }
  return "";
}

// Every rank skips when any rank must: a lone rank cannot make the NCCL world.
void MakeNcclWorld() {
  const LaunchEnv env = DetectLaunchEnv();
  const std::string mine = WhyNoGpu(env);
  std::vector<int32_t> any_missing = {mine.empty() ? 0 : 1};
  mpi_world->AllReduce(Tensor(any_missing.data(), DType::kI32, {1}), ReduceOp::kMax)->Wait();
  if (any_missing[0] != 0) {
    skip_reason = mine.empty() ? "another rank has no usable GPU: NCCL tests skipped" : mine;
    return;
  }
  device = env.local_rank % VisibleCudaDevices();
  try {
    nccl_world = MakeNcclCommunicator(*mpi_world, device, std::chrono::seconds(60));
  } catch (const std::exception& e) {
    create_error = e.what();
  }
}

}  // namespace

Communicator& MpiWorld() { return *mpi_world; }
Communicator* NcclWorld() { return nccl_world.get(); }
int Device() { return device; }
const std::string& SkipReason() { return skip_reason; }
const std::string& CreateError() { return create_error; }

}  // namespace ztrain::comm::test

int main(int argc, char** argv) {
  using namespace ztrain::comm;
  ::testing::InitGoogleTest(&argc, argv);
  test::mpi_world = MakeMpiWorld(std::chrono::seconds(60));
  const int rank = test::mpi_world->rank();
  ztrain::testing::PrintFromRankZero(rank);
  test::MakeNcclWorld();
  if (rank == 0 && !test::skip_reason.empty()) {
    std::printf("SKIPPED on every rank: %s\n", test::skip_reason.c_str());
  }
  const int failed = RUN_ALL_TESTS();
  test::nccl_world.reset();  // before MPI is finalised with the last MPI communicator
  test::mpi_world.reset();
  const auto* unit = ::testing::UnitTest::GetInstance();
  if (failed == 0 && unit->test_to_run_count() > 0 &&
      unit->skipped_test_count() == unit->test_to_run_count()) {
    return test::kSkipped;
  }
  return failed;
}
