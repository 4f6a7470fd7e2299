// main() of the multi-rank tests: one MPI world for the whole binary, and GoogleTest output
// from rank 0 only, plus every failure on any rank prefixed with its rank.
#include <gtest/gtest.h>

#include <cstdio>

#include "parallel/comm/mpi/mpi_communicator.h"
#include "tests/parallel/mpi_test_env.h"

namespace ztrain::comm::test {
namespace {

std::unique_ptr<Communicator> world;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

Communicator& World() { return *world; }

}  // namespace ztrain::comm::test

int main(int argc, char** argv) {
  using namespace ztrain::comm;
  ::testing::InitGoogleTest(&argc, argv);
  test::world = MakeMpiWorld(std::chrono::seconds(60));
  const int rank = test::world->rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new test::RankFailurePrinter(rank));
  }
  const int failed = RUN_ALL_TESTS();
  test::world.reset();  // the last communicator: finalises MPI
  return failed;
}
