// The NCCL communicator's ops on real ranks and GPUs (run under mpirun with 2 ranks, one GPU
// each; every test skips when no GPU is visible). Every expected value is a closed form of
// the rank and the group size, computed on the host; data moves with cudaMemcpy.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "tests/parallel/nccl_test_env.h"

namespace ztrain::comm {
namespace {

using test::DeviceVector;
using test::NcclWorld;

using NcclCommunicatorTest = test::NcclTest;

TEST_F(NcclCommunicatorTest, AllReduceSumMatchesClosedForm) {
  Communicator& w = *NcclWorld();
  const int n = w.size(), r = w.rank();
  for (int64_t count : {int64_t{1}, int64_t{1000}, (int64_t{1} << 20) + 3}) {
    std::vector<float> v(count);
    for (int64_t i = 0; i < count; ++i) v[i] = static_cast<float>((r + 1) * (i % 7));
    DeviceVector<float> d(v);
    w.AllReduce(d.tensor(DType::kF32))->Wait();
    const std::vector<float> got = d.ToHost();
    const float ranks_sum = n * (n + 1) / 2.0f;
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(got[i], ranks_sum * (i % 7)) << "element " << i;
  }
}

TEST_F(NcclCommunicatorTest, AllReduceMaxOfInt32) {
  Communicator& w = *NcclWorld();
  const int count = 100001;
  std::vector<int32_t> v(count);
  for (int i = 0; i < count; ++i) v[i] = (i % 2 ? 1 : -1) * (w.rank() * 10 + i);
  DeviceVector<int32_t> d(v);
  w.AllReduce(d.tensor(DType::kI32), ReduceOp::kMax)->Wait();
  const std::vector<int32_t> got = d.ToHost();
  for (int i = 0; i < count; ++i) ASSERT_EQ(got[i], i % 2 ? (w.size() - 1) * 10 + i : -i) << i;
}

// Small integers are exact in bf16 and fp16, so the sum has one right bit pattern.
TEST_F(NcclCommunicatorTest, AllReducesSixteenBitFloatsOnTheDevice) {
  Communicator& w = *NcclWorld();
  const int n = w.size(), r = w.rank(), count = 4096;
  std::vector<uint16_t> bf(count), half(count);
  for (int i = 0; i < count; ++i) {
    bf[i] = FloatToBf16(static_cast<float>(r + 1 + i % 4));
    half[i] = FloatToHalf(static_cast<float>(r + 1 - i % 5));
  }
  DeviceVector<uint16_t> d_bf(bf), d_half(half);
  w.AllReduce(d_bf.tensor(DType::kBF16))->Wait();
  w.AllReduce(d_half.tensor(DType::kF16), ReduceOp::kMax)->Wait();
  const std::vector<uint16_t> got_bf = d_bf.ToHost(), got_half = d_half.ToHost();
  for (int i = 0; i < count; ++i) {
    ASSERT_EQ(got_bf[i], FloatToBf16(n * (n + 1) / 2.0f + n * (i % 4))) << "bf16 element " << i;
    ASSERT_EQ(got_half[i], FloatToHalf(static_cast<float>(n - i % 5))) << "fp16 element " << i;
  }
}

TEST_F(NcclCommunicatorTest, ReduceScatterGivesEachRankItsChunk) {
  Communicator& w = *NcclWorld();
  const int n = w.size(), r = w.rank(), chunk = 40001;
  std::vector<float> in(static_cast<size_t>(chunk) * n);
  for (int c = 0; c < n; ++c) {
    for (int k = 0; k < chunk; ++k)
      in[c * chunk + k] = static_cast<float>((r + 1) * (c * 100 + k % 50));
  }
  DeviceVector<float> d_in(in), d_out(std::vector<float>(chunk, -1.0f)), d_whole(in);
  w.ReduceScatter(d_in.tensor(DType::kF32), d_out.tensor(DType::kF32))->Wait();
  EXPECT_EQ(d_in.ToHost(), in) << "an out-of-place reduce-scatter changed its input";
  // In place: the output is this rank's chunk of the input.
  w.ReduceScatter(d_whole.tensor(DType::kF32),
                  d_whole.Part(DType::kF32, static_cast<int64_t>(r) * chunk, chunk))
      ->Wait();
  const std::vector<float> out = d_out.ToHost(), whole = d_whole.ToHost();
  const float ranks_sum = n * (n + 1) / 2.0f;
  for (int k = 0; k < chunk; ++k) {
    ASSERT_EQ(out[k], ranks_sum * (r * 100 + k % 50)) << "element " << k;
    ASSERT_EQ(whole[r * chunk + k], out[k]) << "in place, element " << k;
  }
}

TEST_F(NcclCommunicatorTest, AllGatherConcatenatesInRankOrder) {
  Communicator& w = *NcclWorld();
  const int n = w.size(), r = w.rank(), chunk = 333;
  std::vector<float> in(chunk), in_place(static_cast<size_t>(chunk) * n, -1.0f);
  for (int k = 0; k < chunk; ++k)
    in[k] = in_place[r * chunk + k] = static_cast<float>(r * 1000 + k);
  DeviceVector<float> d_in(in), d_out(std::vector<float>(in_place.size(), -1.0f)),
      d_whole(in_place);
  w.AllGather(d_in.tensor(DType::kF32), d_out.tensor(DType::kF32))->Wait();
  w.AllGather(d_whole.Part(DType::kF32, static_cast<int64_t>(r) * chunk, chunk),
              d_whole.tensor(DType::kF32))
      ->Wait();
  // From host memory (a ZeRO-3 shard offloaded there): copied in on the stream, then gathered.
  DeviceVector<float> d_from_host(std::vector<float>(in_place.size(), -1.0f));
  w.AllGather(Tensor(in.data(), DType::kF32, {chunk}), d_from_host.tensor(DType::kF32))->Wait();
  const std::vector<float> out = d_out.ToHost(), whole = d_whole.ToHost(),
                           from_host = d_from_host.ToHost();
  for (int i = 0; i < chunk * n; ++i) {
    ASSERT_EQ(out[i], (i / chunk) * 1000 + i % chunk) << "element " << i;
    ASSERT_EQ(whole[i], out[i]) << "in place, element " << i;
    ASSERT_EQ(from_host[i], out[i]) << "from the host, element " << i;
  }
  // Any dtype moves: bf16 parameters are gathered as raw 16-bit patterns.
  DeviceVector<uint16_t> h_in(std::vector<uint16_t>(5, static_cast<uint16_t>(0x3f80 + r))),
      h_out(std::vector<uint16_t>(5 * n));
  w.AllGather(h_in.tensor(DType::kBF16), h_out.tensor(DType::kBF16))->Wait();
  const std::vector<uint16_t> h = h_out.ToHost();
  for (int i = 0; i < 5 * n; ++i) EXPECT_EQ(h[i], 0x3f80 + i / 5);
}

// NCCL has no all-to-all: the communicator groups a send and a receive per peer.
TEST_F(NcclCommunicatorTest, AllToAllSendsChunkJToRankJ) {
  Communicator& w = *NcclWorld();
  const int n = w.size(), r = w.rank(), chunk = 257;
  std::vector<float> in(static_cast<size_t>(chunk) * n);
  for (int j = 0; j < n; ++j) {
    for (int k = 0; k < chunk; ++k)
      in[j * chunk + k] = static_cast<float>(r * 100000 + j * 1000 + k);
  }
  DeviceVector<float> d_in(in), d_out(std::vector<float>(in.size(), -1.0f));
  w.AllToAll(d_in.tensor(DType::kF32), d_out.tensor(DType::kF32))->Wait();
  const std::vector<float> out = d_out.ToHost();
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < chunk; ++k) ASSERT_EQ(out[i * chunk + k], i * 100000 + r * 1000 + k);
  }
}

TEST_F(NcclCommunicatorTest, BroadcastFromTheLastRank) {
  Communicator& w = *NcclWorld();
  const int root = w.size() - 1;
  std::vector<float> v(4096);
  for (int i = 0; i < 4096; ++i) v[i] = w.rank() == root ? 42.0f + i : -7.0f;
  DeviceVector<float> d(v);
  w.Broadcast(d.tensor(DType::kF32), root)->Wait();
  const std::vector<float> got = d.ToHost();
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(got[i], 42.0f + i);
}

// Both ranks send first: only a grouped launch of the Send and the Recv avoids a deadlock
// (Note [NCCL p2p groups]).
TEST_F(NcclCommunicatorTest, RingExchangeWhereEveryRankSendsFirst) {
  Communicator& w = *NcclWorld();
  const int n = w.size(), r = w.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n, count = 1 << 20;
  std::vector<float> out(count);
  for (int i = 0; i < count; ++i) out[i] = static_cast<float>(r * 7 + i % 1000);
  DeviceVector<float> d_out(out), d_in(std::vector<float>(count, -1.0f));
  WorkPtr send = w.Send(d_out.tensor(DType::kF32), next, 3);
  WorkPtr recv = w.Recv(d_in.tensor(DType::kF32), prev, 3);
  recv->Wait();
  send->Wait();
  const std::vector<float> in = d_in.ToHost();
  for (int i = 0; i < count; ++i) ASSERT_EQ(in[i], prev * 7 + i % 1000) << "element " << i;
}

// Held Send/Recv ops are launched by the next collective, before it: waiting for the
// collective alone finishes them too.
TEST_F(NcclCommunicatorTest, NextCollectiveLaunchesHeldSendsAndRecvsFirst) {
  Communicator& w = *NcclWorld();
  const int n = w.size(), r = w.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  DeviceVector<int32_t> d_out(std::vector<int32_t>(64, r)), d_in(std::vector<int32_t>(64, -1)),
      d_sum(std::vector<int32_t>(8, 1));
  WorkPtr send = w.Send(d_out.tensor(DType::kI32), next, 0);
  WorkPtr recv = w.Recv(d_in.tensor(DType::kI32), prev, 0);
  w.AllReduce(d_sum.tensor(DType::kI32))->Wait();
  EXPECT_TRUE(send->Done());
  EXPECT_TRUE(recv->Done());
  EXPECT_EQ(d_in.ToHost(), std::vector<int32_t>(64, prev));
  EXPECT_EQ(d_sum.ToHost(), std::vector<int32_t>(8, n));
  send->Wait();
  recv->Wait();
}

TEST_F(NcclCommunicatorTest, OpsRunAndFinishInIssueOrder) {
  Communicator& w = *NcclWorld();
  const int n = w.size(), r = w.rank();
  DeviceVector<float> a(std::vector<float>(100000, static_cast<float>(r + 1))),
      b(std::vector<float>(5000, static_cast<float>(r))),
      c(std::vector<float>(10, static_cast<float>(r))), d(std::vector<float>(10 * n)),
      e(std::vector<float>(64 * n, 1.0f)), f(std::vector<float>(64));
  std::vector<WorkPtr> works;
  works.push_back(w.AllReduce(a.tensor(DType::kF32)));         // a = n(n+1)/2
  works.push_back(w.Broadcast(b.tensor(DType::kF32), n - 1));  // b = n-1
  works.push_back(w.AllGather(c.tensor(DType::kF32), d.tensor(DType::kF32)));
  works.push_back(w.ReduceScatter(e.tensor(DType::kF32), f.tensor(DType::kF32)));  // f = n
  works.push_back(w.Barrier());
  works.push_back(w.AllReduce(a.tensor(DType::kF32)));  // sees the first: n * n(n+1)/2
  works.back()->Wait();
  for (size_t i = 0; i < works.size(); ++i) EXPECT_TRUE(works[i]->Done()) << "op " << i;
  for (float x : a.ToHost()) ASSERT_EQ(x, n * (n * (n + 1) / 2.0f));
  for (float x : b.ToHost()) ASSERT_EQ(x, n - 1);
  const std::vector<float> gathered = d.ToHost();
  for (int i = 0; i < 10 * n; ++i) ASSERT_EQ(gathered[i], i / 10);
  for (float x : f.ToHost()) ASSERT_EQ(x, n);
  for (auto& work : works) work->Wait();
}

// The last rank arrives late; the others' Barrier cannot finish before it does.
TEST_F(NcclCommunicatorTest, BarrierWaitsForTheLastRank) {
  Communicator& w = *NcclWorld();
  w.Barrier()->Wait();
  const auto start = std::chrono::steady_clock::now();
  if (w.rank() == w.size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  w.Barrier()->Wait();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.25);
}

TEST_F(NcclCommunicatorTest, SplitIntoEvenAndOddRanks) {
  Communicator& w = *NcclWorld();
  const int n = w.size(), r = w.rank();
  ASSERT_EQ(n % 2, 0) << "run with an even number of ranks";
  auto group = w.Split(r % 2, n - r);  // key n - r: reverse world order
  EXPECT_EQ(group->size(), n / 2);
  EXPECT_EQ(group->rank(), (n - 1 - r) / 2);
  EXPECT_EQ(group->timeout(), w.timeout());
  std::string members;
  for (int q = n - 2 + r % 2; q >= 0; q -= 2)
    members += detail::StrCat(members.empty() ? "" : ",", q);
  EXPECT_EQ(group->name(), detail::StrCat("group of ", n / 2, " (world ranks ", members, ")"));
  DeviceVector<float> v(std::vector<float>(1000, static_cast<float>(r)));
  group->AllReduce(v.tensor(DType::kF32))->Wait();
  float parity_sum = 0;
  for (int q = r % 2; q < n; q += 2) parity_sum += q;
  for (float x : v.ToHost()) ASSERT_EQ(x, parity_sum);
  group->set_label("dp group");
  EXPECT_EQ(group->name().rfind(detail::StrCat("dp group of ", n / 2), 0), 0u);
}

TEST_F(NcclCommunicatorTest, ByteCountsEqualTheFormulas) {
  Communicator& w = *NcclWorld();
  const int64_t n = w.size();
  const int64_t floats = 3000 * n;
  DeviceVector<float> buf(std::vector<float>(floats, 1.0f)), shard(std::vector<float>(floats / n)),
      message(std::vector<float>(100)), inbox(std::vector<float>(100));
  const CommStats before = w.stats();
  w.AllReduce(buf.tensor(DType::kF32))->Wait();
  w.ReduceScatter(buf.tensor(DType::kF32), shard.tensor(DType::kF32))->Wait();
  w.AllGather(shard.tensor(DType::kF32), buf.tensor(DType::kF32))->Wait();
  w.Broadcast(shard.tensor(DType::kF32), 0)->Wait();
  WorkPtr send = w.Send(message.tensor(DType::kF32), static_cast<int>((w.rank() + 1) % n), 1);
  w.Recv(inbox.tensor(DType::kF32), static_cast<int>((w.rank() + n - 1) % n), 1)->Wait();
  send->Wait();
  w.Barrier()->Wait();
  const CommStats after = w.stats();
  auto delta = [&](OpKind k) { return after.Bytes(k) - before.Bytes(k); };
  EXPECT_EQ(delta(OpKind::kAllReduce), 2 * (n - 1) * 4 * floats / n);
  EXPECT_EQ(delta(OpKind::kReduceScatter), (n - 1) * 4 * floats / n);
  EXPECT_EQ(delta(OpKind::kAllGather), (n - 1) * 4 * floats / n);
  EXPECT_EQ(delta(OpKind::kBroadcast), 4 * floats / n);
  EXPECT_EQ(delta(OpKind::kSend), 400);
  EXPECT_EQ(delta(OpKind::kRecv), 400);
  EXPECT_EQ(delta(OpKind::kBarrier), 0);
  EXPECT_EQ(after.ops[static_cast<int>(OpKind::kBarrier)] -
                before.ops[static_cast<int>(OpKind::kBarrier)],
            1);
}

// Work::Done() turns true without Wait() while the caller does other things.
TEST_F(NcclCommunicatorTest, DoneTurnsTrueWithoutWait) {
  Communicator& w = *NcclWorld();
  DeviceVector<float> v(std::vector<float>(1 << 20, 1.0f));
  WorkPtr work = w.AllReduce(v.tensor(DType::kF32));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!work->Done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ASSERT_TRUE(work->Done());
  work->Wait();
  const std::vector<float> got = v.ToHost();
  for (size_t i = 0; i < got.size(); i += 4097) ASSERT_EQ(got[i], w.size());
}

}  // namespace
}  // namespace ztrain::comm
