// main() of the multi-rank tests: one MPI world for the whole binary, and GoogleTest output
// from rank 0 only, plus every failure on any rank prefixed with its rank.
#include <gtest/gtest.h>

#include "parallel/comm/mpi/mpi_communicator.h"
#include "tests/parallel/mpi_test_env.h"
#include "tests/parallel/rank_output.h"

namespace ztrain::comm::test {
namespace {

std::unique_ptr<Communicator> world;

}  // namespace

Communicator& World() { return *world; }

}  // namespace ztrain::comm::test

int main(int argc, char** argv) {
  using namespace ztrain::comm;
  ::testing::InitGoogleTest(&argc, argv);
  test::world = MakeMpiWorld(std::chrono::seconds(60));
  ztrain::testing::PrintFromRankZero(test::world->rank());
  const int failed = RUN_ALL_TESTS();
  test::world.reset();  // the last communicator: finalises MPI
  return failed;
}
