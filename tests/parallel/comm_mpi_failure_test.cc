// Timeouts, failed ops and compute overlap on real ranks (run under mpirun).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "tests/parallel/mpi_test_env.h"

namespace ztrain::comm {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using test::F32;
using test::World;

double SecondsSince(steady_clock::time_point t) {
  return std::chrono::duration<double>(steady_clock::now() - t).count();
}

// Polls until `work` is done or `limit` passes; true when done.
bool DoneWithin(Work& work, std::chrono::seconds limit) {
  const auto deadline = steady_clock::now() + limit;
  while (!work.Done()) {
    if (steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

// The last rank skips an all-reduce; the others' Wait throws within the timeout, naming the
// op. The late rank then joins, so the collective completes and MPI stays consistent.
TEST(MpiFailureTest, WaitThrowsCommErrorWhenARankDoesNotJoin) {
  Communicator& w = World();
  const int n = w.size(), r = w.rank();
  const bool late = r == n - 1;
  auto group = w.Split(0, r);
  group->set_timeout(late ? milliseconds(60000) : milliseconds(500));
  std::vector<float> v(1024, 1.0f);
  if (!late) {
    WorkPtr work = group->AllReduce(F32(v));
    const auto start = steady_clock::now();
    try {
      work->Wait();
      ADD_FAILURE() << "Wait returned although rank " << n - 1 << " never joined";
    } catch (const CommError& e) {
      const double waited = SecondsSince(start);
      EXPECT_GE(waited, 0.5);
      EXPECT_LT(waited, 5.0);  // 0.5 s plus scheduling slack on an oversubscribed machine
      const std::string what = e.what();
      if (r == 0) std::printf("rank 0's error: %s\n", e.what());
      EXPECT_NE(what.find(detail::StrCat("AllReduce of 4096 bytes on ", group->name())),
                std::string::npos)
          << what;
      EXPECT_NE(what.find(detail::StrCat("rank ", r, " waited 0.")), std::string::npos) << what;
    }
    // The communicator is now failed: later ops are refused at once.
    std::vector<float> other(8);
    try {
      group->Broadcast(F32(other), 0)->Wait();
      ADD_FAILURE() << "a failed communicator ran an op";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("was not run"), std::string::npos) << e.what();
    }
    w.Barrier()->Wait();  // tells the late rank that the timeout fired
    // MPI cannot cancel the started all-reduce: it completes once the late rank joins.
    ASSERT_TRUE(DoneWithin(*work, std::chrono::seconds(30)));
  } else {
    w.Barrier()->Wait();
    group->AllReduce(F32(v))->Wait();
  }
  for (float x : v) ASSERT_EQ(x, n);
  group.reset();
  w.Barrier()->Wait();
}

// A collective stuck behind an unmatched Recv: the timeout names the Recv as the culprit.
TEST(MpiFailureTest, TimeoutNamesTheOpItWasQueuedBehind) {
  Communicator& w = World();
  const int n = w.size(), r = w.rank();
  const bool late = r == n - 1;
  auto group = w.Split(0, r);
  group->set_timeout(late ? milliseconds(60000) : milliseconds(500));
  std::vector<float> message(4, -1.0f), v(16, 1.0f);
  if (!late) {
    WorkPtr recv = group->Recv(F32(message), n - 1, 5);
    WorkPtr reduce = group->AllReduce(F32(v));
    try {
      reduce->Wait();
      ADD_FAILURE() << "the all-reduce ran before the receive it follows";
    } catch (const CommError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(detail::StrCat("waited 0.")), std::string::npos) << what;
      EXPECT_NE(what.find(detail::StrCat("for AllReduce of 64 bytes on ", group->name())),
                std::string::npos)
          << what;
      EXPECT_NE(
          what.find(detail::StrCat("queued behind Recv of 16 bytes from rank ", n - 1, " (tag 5)")),
          std::string::npos)
          << what;
    }
    w.Barrier()->Wait();
    // The started receive still completes; the queued all-reduce was dropped, never started.
    ASSERT_TRUE(DoneWithin(*recv, std::chrono::seconds(30)));
    for (float x : message) EXPECT_EQ(x, 7.0f);
    EXPECT_TRUE(reduce->Done());
  } else {
    w.Barrier()->Wait();
    std::vector<float> seven(4, 7.0f);
    std::vector<WorkPtr> sends;
    for (int peer = 0; peer < n - 1; ++peer) sends.push_back(group->Send(F32(seven), peer, 5));
    for (auto& s : sends) s->Wait();
  }
  group.reset();
  w.Barrier()->Wait();
}

TEST(MpiFailureTest, RecvOfTheWrongSizeFailsNamingThePeer) {
  Communicator& w = World();
  auto group = w.Split(0, w.rank());
  std::vector<float> small(4, 1.0f), large(8);
  if (w.rank() == 0) group->Send(F32(small), 1, 9)->Wait();
  if (w.rank() == 1) {
    try {
      group->Recv(F32(large), 0, 9)->Wait();
      ADD_FAILURE() << "a short message passed as a full one";
    } catch (const CommError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("Recv of 32 bytes from rank 0 (tag 9)"), std::string::npos) << what;
      EXPECT_NE(what.find("received 16 bytes"), std::string::npos) << what;
    }
  }
  group.reset();
  w.Barrier()->Wait();
}

// The worker thread progresses an all-reduce while the caller computes and never calls
// Wait(): Done() turns true during the compute loop.
TEST(MpiOverlapTest, AllReduceProgressesWhileTheCallerComputes) {
  Communicator& w = World();
  const int n = w.size();
  std::vector<float> v(1 << 20, 1.0f);  // 4 MiB: several segments of MPI's algorithm
  w.Barrier()->Wait();
  const auto issued = steady_clock::now();
  WorkPtr work = w.AllReduce(F32(v));
  const double issue_seconds = SecondsSince(issued);
  double sink = 0;
  int64_t iterations = 0;
  const auto deadline = steady_clock::now() + std::chrono::seconds(30);
  while (!work->Done() && steady_clock::now() < deadline) {
    for (int i = 0; i < 1000; ++i) sink += std::sin(static_cast<double>(i + iterations));
    ++iterations;
  }
  const double compute_seconds = SecondsSince(issued);
  ASSERT_TRUE(work->Done()) << "the all-reduce made no progress during " << compute_seconds
                            << " s of compute";
  EXPECT_GT(iterations, 0);
  EXPECT_LT(issue_seconds, 0.05) << "issuing must not wait for the op";
  work->Wait();
  for (size_t i = 0; i < v.size(); i += 4097) ASSERT_EQ(v[i], n);
  EXPECT_NE(sink, 12345.0);  // keeps the compute loop
  RecordProperty("compute_iterations", std::to_string(iterations));
}

}  // namespace
}  // namespace ztrain::comm
