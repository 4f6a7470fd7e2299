// The NCCL communicator's failures on real ranks and GPUs (run under mpirun): a rank that
// does not join times the others out, which aborts the communicator; bad arguments throw
// from the issuing call and leave the communicator usable. Deliberate failures happen on a
// split group, so the NCCL world stays healthy for the tests after them; the MPI world
// tells the late rank when the others have given up.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/parallel/nccl_test_env.h"

namespace ztrain::comm {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using test::DeviceVector;
using test::MpiWorld;
using test::NcclWorld;

using NcclFailureTest = test::NcclTest;

double SecondsSince(steady_clock::time_point t) {
  return std::chrono::duration<double>(steady_clock::now() - t).count();
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A group of every rank with the timeout of a rank that is (late) or is not waited for, and
// its connections made: the first op between two ranks connects them, and the test is about
// an op that is enqueued and then never matched.
std::unique_ptr<Communicator> WarmGroup(bool late, DeviceVector<float>& buf) {
  Communicator& w = *NcclWorld();
  auto group = w.Split(0, w.rank());
  group->AllReduce(buf.tensor(DType::kF32))->Wait();
  // The late rank only waits for NCCL when it destroys the group.
  group->set_timeout(late ? milliseconds(5000) : milliseconds(500));
  return group;
}

TEST_F(NcclFailureTest, WaitThrowsCommErrorWhenARankDoesNotJoin) {
  const int n = NcclWorld()->size(), r = NcclWorld()->rank();
  const bool late = r == n - 1;
  DeviceVector<float> v(std::vector<float>(1024, 1.0f));
  auto group = WarmGroup(late, v);
  if (!late) {
    const auto start = steady_clock::now();
    WorkPtr work = group->AllReduce(v.tensor(DType::kF32));
    try {
      work->Wait();
      ADD_FAILURE() << "Wait returned although rank " << n - 1 << " never joined";
    } catch (const CommError& e) {
      const double waited = SecondsSince(start);
      EXPECT_GE(waited, 0.5);
      EXPECT_LT(waited, 5.0);
      const std::string what = e.what();
      if (r == 0) std::printf("rank 0's error: %s\n", e.what());
      EXPECT_TRUE(Contains(
          what, detail::StrCat("AllReduce of 1024 fp32 elements (4096 bytes) on ", group->name())))
          << what;
      EXPECT_TRUE(Contains(what, detail::StrCat("rank ", r, " waited 0."))) << what;
      EXPECT_TRUE(Contains(what, "(timeout 500 ms)")) << what;
    }
    EXPECT_TRUE(work->Done());
    // The NCCL communicator was aborted: later ops fail at once, naming the first failure.
    DeviceVector<float> other(std::vector<float>(8));
    const auto again = steady_clock::now();
    try {
      group->Broadcast(other.tensor(DType::kF32), 0)->Wait();
      ADD_FAILURE() << "an aborted communicator ran an op";
    } catch (const CommError& e) {
      EXPECT_TRUE(Contains(e.what(), "Broadcast of 8 fp32 elements (32 bytes) from root 0"))
          << e.what();
      EXPECT_TRUE(Contains(e.what(), "was not run: this communicator failed earlier")) << e.what();
    }
    EXPECT_LT(SecondsSince(again), 0.1);
    EXPECT_THROW(group->Split(0, 0), CommError);
  }
  MpiWorld().Barrier()->Wait();  // the late rank never issues the all-reduce
  group.reset();
  // The world is a different NCCL communicator and still works.
  DeviceVector<float> check(std::vector<float>(16, 1.0f));
  NcclWorld()->AllReduce(check.tensor(DType::kF32))->Wait();
  for (float x : check.ToHost()) ASSERT_EQ(x, n);
}

// An all-reduce stuck behind an unmatched Recv: the error names both.
TEST_F(NcclFailureTest, TimeoutNamesTheOpItWasQueuedBehind) {
  const int n = NcclWorld()->size(), r = NcclWorld()->rank();
  const bool late = r == n - 1;
  DeviceVector<float> message(std::vector<float>(4, -1.0f)), v(std::vector<float>(16, 1.0f)),
      out(std::vector<float>(4, 2.0f)), inbox(std::vector<float>(4 * n));
  auto group = WarmGroup(late, v);
  // Connect every rank's p2p channels to the late rank as well (ops in flight together
  // must not share buffers: each peer has its own part of the inbox).
  if (!late) {
    WorkPtr send = group->Send(out.tensor(DType::kF32), n - 1, 0);
    group->Recv(inbox.Part(DType::kF32, 0, 4), n - 1, 0)->Wait();
    send->Wait();
  } else {
    std::vector<WorkPtr> works;
    for (int peer = 0; peer < n - 1; ++peer) {
      works.push_back(group->Recv(inbox.Part(DType::kF32, 4 * peer, 4), peer, 0));
      works.push_back(group->Send(out.tensor(DType::kF32), peer, 0));
    }
    for (auto& work : works) work->Wait();
  }
  if (!late) {
    WorkPtr recv = group->Recv(message.tensor(DType::kF32), n - 1, 5);
    WorkPtr reduce = group->AllReduce(v.tensor(DType::kF32));
    try {
      reduce->Wait();
      ADD_FAILURE() << "the all-reduce finished although the receive before it cannot";
    } catch (const CommError& e) {
      const std::string what = e.what();
      EXPECT_TRUE(Contains(what, "AllReduce of 16 fp32 elements (64 bytes)")) << what;
      EXPECT_TRUE(Contains(
          what, detail::StrCat("Recv of 4 fp32 elements (16 bytes) from rank ", n - 1, " (tag 5)")))
          << what;
      EXPECT_TRUE(Contains(what, "waited 0.")) << what;
    }
    EXPECT_TRUE(recv->Done());
    EXPECT_THROW(recv->Wait(), CommError);
  }
  MpiWorld().Barrier()->Wait();
  group.reset();
}

// Bad arguments throw ztrain::Error from the issuing call, before NCCL sees them, and count
// nothing; the communicator stays usable.
TEST_F(NcclFailureTest, BadArgumentsThrowFromTheIssuingCall) {
  Communicator& w = *NcclWorld();
  const int n = w.size(), r = w.rank();
  DeviceVector<float> d(std::vector<float>(4 * n, 1.0f)), small(std::vector<float>(3));
  DeviceVector<uint16_t> raw(std::vector<uint16_t>(8));
  std::vector<float> host(4 * n, 1.0f);
  const CommStats before = w.stats();
  auto expect_error = [](const auto& op, const std::string& part) {
    try {
      op();
      ADD_FAILURE() << "no error; expected one containing: " << part;
    } catch (const CommError& e) {
      ADD_FAILURE() << "a CommError (" << e.what() << ") where an argument error was expected";
    } catch (const Error& e) {
      EXPECT_TRUE(Contains(e.what(), part)) << e.what();
    }
  };
  const Tensor on_host(host.data(), DType::kF32, {4 * n});
  const Tensor host_says_cuda(host.data(), DType::kF32, {4 * n}, Device::Cuda(test::Device()));
  const Tensor other_device =
      Tensor(d.tensor(DType::kF32).data(), DType::kF32, {4 * n}, Device::Cuda(test::Device() + 1));
  expect_error([&] { w.AllReduce(on_host); },
               "AllReduce: the NCCL communicator moves memory on cuda:");
  expect_error([&] { w.AllReduce(on_host); }, "got a tensor on cpu (copy it to the GPU");
  expect_error([&] { w.Broadcast(host_says_cuda, 0); }, "is host memory");
  expect_error([&] { w.Send(other_device, (r + 1) % n, 0); }, "got a tensor on cuda:");
  expect_error([&] { w.AllReduce(raw.tensor(DType::kU16)); }, "reductions take fp32, bf16, fp16");
  expect_error([&] { w.ReduceScatter(d.tensor(DType::kF32), small.tensor(DType::kF32)); },
               "expected " + std::to_string(n) + " chunks");
  expect_error([&] { w.AllGather(d.Part(DType::kF32, 1, 4), d.tensor(DType::kF32)); },
               "not this rank's chunk");
  expect_error([&] { w.Broadcast(d.tensor(DType::kF32), n); }, "root " + std::to_string(n));
  expect_error([&] { w.Send(d.tensor(DType::kF32), r, 0); }, "cannot message itself");
  expect_error([&] { w.Recv(d.tensor(DType::kF32), n, 0); }, "is not a rank of a group of");
  expect_error([&] { w.Send(d.tensor(DType::kF32), (r + 1) % n, -1); }, "tag -1 is negative");
  expect_error([&] { w.Split(-1, 0); }, "color -1 is negative");
  EXPECT_EQ(w.stats().TotalBytes(), before.TotalBytes());
  w.AllReduce(d.tensor(DType::kF32))->Wait();
  for (float x : d.ToHost()) ASSERT_EQ(x, n);
}

}  // namespace
}  // namespace ztrain::comm
