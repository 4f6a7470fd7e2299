// Timeouts, failed ops and compute overlap on real ranks (run under mpirun).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
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
using test::I32;
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
      // The late rank is alive (its worker answers while idle): nobody is blamed as silent.
      EXPECT_NE(what.find("every other rank answered a liveness probe"), std::string::npos) << what;
      EXPECT_EQ(what.find("does not answer"), std::string::npos) << what;
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

// Whether process `pid` is stopped (state T in /proc/<pid>/stat), waiting up to `limit`.
bool StoppedWithin(int pid, std::chrono::seconds limit) {
  const auto deadline = steady_clock::now() + limit;
  while (steady_clock::now() < deadline) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');  // the name may hold spaces and parentheses
    if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T') {
      return true;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  return false;
}

// "rank 1 answered", "ranks 0 and 2 answered": the ranks below `silent` other than `me`.
std::string ExpectedAnswered(int me, int silent) {
  std::vector<int> ranks;
  for (int r = 0; r < silent; ++r) {
    if (r != me) ranks.push_back(r);
  }
  std::string list;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) list += i + 1 == ranks.size() ? " and " : ", ";
    list += std::to_string(ranks[i]);
  }
  return detail::StrCat(ranks.size() == 1 ? "rank " : "ranks ", list, " answered");
}

// The last rank stops as a hung process would (SIGSTOP: none of its threads runs). A timeout
// alone cannot tell it from the ranks that waited for it; the liveness probe can: every
// other rank's Wait names it, with its host, as the rank that does not answer, and names the
// ranks that did. Rank 0 then continues it, and it joins the collective; a timeout of its
// own soon after names its stall.
TEST(MpiFailureTest, TimeoutNamesTheRankThatStoppedAnswering) {
  Communicator& w = World();
  const int n = w.size(), r = w.rank(), last = n - 1;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::vector<int32_t> mine = {static_cast<int32_t>(getpid()),
                               static_cast<int32_t>(std::hash<std::string>()(host))};
  std::vector<int32_t> all(2 * n);
  w.AllGather(I32(mine), I32(all))->Wait();
  for (int i = 0; i < n; ++i) {
    if (all[2 * i + 1] != all[1]) GTEST_SKIP() << "the ranks run on several hosts";
  }
  const int stopped_pid = all[2 * last];
  auto group = w.Split(0, r);
  auto waiting = w.Split(r == last ? 1 : 0, r);  // the ranks that wait for the stopped one
  group->set_timeout(r == last ? milliseconds(60000) : milliseconds(500));
  std::vector<float> v(1024, 1.0f);
  if (r == last) {
    raise(SIGSTOP);  // returns once rank 0 sends SIGCONT
    w.Barrier()->Wait();
    group->AllReduce(F32(v))->Wait();
  } else {
    ASSERT_TRUE(StoppedWithin(stopped_pid, std::chrono::seconds(30)));
    WorkPtr work = group->AllReduce(F32(v));
    const auto start = steady_clock::now();
    try {
      work->Wait();
      ADD_FAILURE() << "Wait returned although rank " << last << " is stopped";
    } catch (const CommError& e) {
      const double waited = SecondsSince(start);
      EXPECT_GE(waited, 1.0);  // the timeout, then the probe's grace of min(5 s, timeout)
      EXPECT_LT(waited, 5.0);
      const std::string what = e.what();
      if (r == 0) std::printf("rank 0's error: %s\n", e.what());
      EXPECT_NE(what.find(detail::StrCat("rank ", r, " waited 0.")), std::string::npos) << what;
      EXPECT_NE(what.find(detail::StrCat("rank ", last, " (host ", host,
                                         ") does not answer: it is stopped, hung or too slow")),
                std::string::npos)
          << what;
      if (n > 2) {
        EXPECT_NE(what.find(ExpectedAnswered(r, last)), std::string::npos) << what;
      }
    }
    // Waiting again reports the same timeout at once, not after a second one.
    const auto again = steady_clock::now();
    EXPECT_THROW(work->Wait(), CommError);
    EXPECT_LT(SecondsSince(again), 0.2);
    // Every probe has ended before the stopped rank runs again (it would answer them late);
    // it stays stopped for 2 s or so, a stall its own workers notice.
    waiting->Barrier()->Wait();
    if (r == 0) {
      std::this_thread::sleep_for(milliseconds(1000));
      kill(stopped_pid, SIGCONT);
    }
    w.Barrier()->Wait();
    ASSERT_TRUE(DoneWithin(*work, std::chrono::seconds(30)));
  }
  for (float x : v) ASSERT_EQ(x, n);
  waiting.reset();
  group.reset();

  // Running again, the stopped rank times out in turn (the others join late): its error
  // blames its own stall, not the ranks that waited for it.
  auto after = w.Split(0, r);
  after->set_timeout(r == last ? milliseconds(500) : milliseconds(60000));
  if (r == last) {
    WorkPtr barrier = after->Barrier();
    try {
      barrier->Wait();
      ADD_FAILURE() << "a barrier the others had not joined returned";
    } catch (const CommError& e) {
      const std::string what = e.what();
      std::printf("rank %d's error: %s\n", r, e.what());
      EXPECT_NE(what.find("this rank itself did not run for "), std::string::npos) << what;
      EXPECT_EQ(what.find("does not answer"), std::string::npos) << what;
    }
    w.Barrier()->Wait();
    ASSERT_TRUE(DoneWithin(*barrier, std::chrono::seconds(30)));
  } else {
    w.Barrier()->Wait();
    after->Barrier()->Wait();
  }
  after.reset();
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
