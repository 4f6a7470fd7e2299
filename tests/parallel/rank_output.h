#pragma once
// GoogleTest output of a multi-rank test binary: rank 0 prints as usual; every other rank prints
// only its failures, each line prefixed with its rank, so that a failure on any rank is seen
// without N copies of every line. Every rank's result still counts through its exit code.
#include <gtest/gtest.h>

#include <cstdio>

namespace ztrain::testing {

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

// Call after InitGoogleTest and before RUN_ALL_TESTS, on every rank.
inline void PrintFromRankZero(int rank) {
  if (rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(rank));
}

}  // namespace ztrain::testing
