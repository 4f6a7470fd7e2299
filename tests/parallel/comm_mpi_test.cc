// Collectives, point-to-point, Split and byte counts on real ranks (run under mpirun with
// 2 and 4 ranks). Every expected value is a closed form of the rank and the group size.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "parallel/process_grid.h"
#include "tests/parallel/mpi_test_env.h"

namespace ztrain::comm {
namespace {

using test::F32;
using test::I32;
using test::World;

TEST(MpiCommunicatorTest, AllReduceSumMatchesClosedForm) {
  Communicator& w = World();
  const int n = w.size(), r = w.rank();
  // Small ones take MPI's own algorithm, large ones the ring (Note [ring collectives]); the
  // largest does not divide by the group size.
  for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{100000}, (int64_t{3} << 20) + 3}) {
    std::vector<float> v(count);
    for (int64_t i = 0; i < count; ++i) v[i] = static_cast<float>((r + 1) * (i % 7));
    w.AllReduce(F32(v))->Wait();
    const float ranks_sum = n * (n + 1) / 2.0f;
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(v[i], ranks_sum * (i % 7)) << "element " << i;
  }
}

TEST(MpiCommunicatorTest, AllReduceMaxOfInt32) {
  Communicator& w = World();
  for (int count : {257, 100001}) {
    std::vector<int32_t> v(count);
    for (int i = 0; i < count; ++i) v[i] = (i % 2 ? 1 : -1) * (w.rank() * 10 + i);
    w.AllReduce(I32(v), ReduceOp::kMax)->Wait();
    for (int i = 0; i < count; ++i) {
      ASSERT_EQ(v[i], i % 2 ? (w.size() - 1) * 10 + i : -i) << "element " << i;
    }
  }
}

TEST(MpiCommunicatorTest, ReduceScatterGivesEachRankItsChunk) {
  Communicator& w = World();
  const int n = w.size(), r = w.rank();
  for (int chunk : {1001, 40000}) {  // MPI's algorithm, then the ring
    std::vector<float> in(chunk * n), out(chunk, -1.0f);
    for (int c = 0; c < n; ++c) {
      for (int k = 0; k < chunk; ++k)
        in[c * chunk + k] = static_cast<float>((r + 1) * (c * 100 + k % 50));
    }
    const std::vector<float> original = in;
    std::vector<float> in_place = in;
    w.ReduceScatter(F32(in), F32(out))->Wait();
    EXPECT_EQ(in, original) << "an out-of-place reduce-scatter changed its input";
    // In place: the output is this rank's chunk of the input.
    Tensor whole = F32(in_place);
    Tensor mine = whole.Flat(static_cast<int64_t>(r) * chunk, {chunk});
    w.ReduceScatter(whole, mine)->Wait();
    const float ranks_sum = n * (n + 1) / 2.0f;
    for (int k = 0; k < chunk; ++k) {
      ASSERT_EQ(out[k], ranks_sum * (r * 100 + k % 50)) << "chunk " << chunk << ", element " << k;
      ASSERT_EQ(in_place[r * chunk + k], out[k]) << "in place, element " << k;
    }
  }
}

TEST(MpiCommunicatorTest, AllGatherConcatenatesInRankOrder) {
  Communicator& w = World();
  const int n = w.size(), r = w.rank();
  const int chunk = 333;
  std::vector<float> in(chunk), out(chunk * n, -1.0f), in_place(chunk * n, -1.0f);
  for (int k = 0; k < chunk; ++k)
    in[k] = in_place[r * chunk + k] = static_cast<float>(r * 1000 + k);
  w.AllGather(F32(in), F32(out))->Wait();
  Tensor whole = F32(in_place);
  w.AllGather(whole.Flat(static_cast<int64_t>(r) * chunk, {chunk}), whole)->Wait();
  for (int c = 0; c < n; ++c) {
    for (int k = 0; k < chunk; ++k) {
      ASSERT_EQ(out[c * chunk + k], c * 1000 + k);
      ASSERT_EQ(in_place[c * chunk + k], c * 1000 + k);
    }
  }
  // Any dtype moves: bf16 parameters are gathered as raw 16-bit patterns.
  std::vector<uint16_t> h_in(5, static_cast<uint16_t>(0x3f80 + r)), h_out(5 * n);
  w.AllGather(Tensor(h_in.data(), DType::kBF16, {5}), Tensor(h_out.data(), DType::kBF16, {5 * n}))
      ->Wait();
  for (int i = 0; i < 5 * n; ++i) EXPECT_EQ(h_out[i], 0x3f80 + i / 5);
}

TEST(MpiCommunicatorTest, BroadcastFromTheLastRank) {
  Communicator& w = World();
  const int root = w.size() - 1;
  std::vector<float> v(4096);
  for (int i = 0; i < 4096; ++i) v[i] = w.rank() == root ? 42.0f + i : -7.0f;
  w.Broadcast(F32(v), root)->Wait();
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(v[i], 42.0f + i);
}

TEST(MpiCommunicatorTest, RingExchangeWhereEveryRankSendsFirst) {
  Communicator& w = World();
  const int n = w.size(), r = w.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // 4 MiB: beyond the eager limit, so a send completes only once its receive is posted.
  const int count = 1 << 20;
  std::vector<float> out(count), in(count, -1.0f);
  for (int i = 0; i < count; ++i) out[i] = static_cast<float>(r * 7 + i % 1000);
  WorkPtr send = w.Send(F32(out), next, 3);
  WorkPtr recv = w.Recv(F32(in), prev, 3);
  recv->Wait();
  send->Wait();
  for (int i = 0; i < count; ++i) ASSERT_EQ(in[i], prev * 7 + i % 1000) << "element " << i;
}

TEST(MpiCommunicatorTest, OpsRunAndFinishInIssueOrder) {
  Communicator& w = World();
  const int n = w.size(), r = w.rank();
  std::vector<float> a(100000, static_cast<float>(r + 1)), b(5000, static_cast<float>(r)),
      c(10, static_cast<float>(r)), d(10 * n), e(64 * n, 1.0f), f(64);
  std::vector<WorkPtr> works;
  works.push_back(w.AllReduce(F32(a)));         // a = n(n+1)/2
  works.push_back(w.Broadcast(F32(b), n - 1));  // b = n-1
  works.push_back(w.AllGather(F32(c), F32(d)));
  works.push_back(w.ReduceScatter(F32(e), F32(f)));  // f = n
  works.push_back(w.Barrier());
  works.push_back(w.AllReduce(F32(a)));  // sees the first: a = n * n(n+1)/2
  works.back()->Wait();
  for (size_t i = 0; i < works.size(); ++i) EXPECT_TRUE(works[i]->Done()) << "op " << i;
  for (float x : a) ASSERT_EQ(x, n * (n * (n + 1) / 2.0f));
  for (float x : b) ASSERT_EQ(x, n - 1);
  for (int i = 0; i < 10 * n; ++i) ASSERT_EQ(d[i], i / 10);
  for (float x : f) ASSERT_EQ(x, n);
  for (auto& work : works) work->Wait();
}

TEST(MpiCommunicatorTest, SplitIntoEvenAndOddRanks) {
  Communicator& w = World();
  const int n = w.size(), r = w.rank();
  ASSERT_EQ(n % 2, 0) << "run with an even number of ranks";
  // Key n - r: group ranks in reverse world order.
  auto group = w.Split(r % 2, n - r);
  EXPECT_EQ(group->size(), n / 2);
  EXPECT_EQ(group->rank(), (n - 1 - r) / 2);
  EXPECT_EQ(group->timeout(), w.timeout());
  std::string members;
  for (int q = n - 2 + r % 2; q >= 0; q -= 2)
    members += detail::StrCat(members.empty() ? "" : ",", q);
  EXPECT_EQ(group->name(), detail::StrCat("group of ", n / 2, " (world ranks ", members, ")"));
  std::vector<float> v(1000, static_cast<float>(r));
  group->AllReduce(F32(v))->Wait();
  float parity_sum = 0;
  for (int q = r % 2; q < n; q += 2) parity_sum += q;
  for (float x : v) ASSERT_EQ(x, parity_sum);
  // The group's broadcast from its rank 0 is the largest world rank of that parity.
  std::vector<float> b(10, static_cast<float>(r));
  group->Broadcast(F32(b), 0)->Wait();
  for (float x : b) ASSERT_EQ(x, n - 2 + r % 2);
}

TEST(MpiCommunicatorTest, GridCommunicatorsMatchTheGrid) {
  Communicator& w = World();
  const int n = w.size(), r = w.rank();
  const ProcessGrid grid(n, n / 2, 1, 2);
  GridCommunicators comms = MakeGridCommunicators(w, grid);
  for (auto [comm, expected] :
       {std::pair{comms.dp.get(), grid.DpGroup(r)}, std::pair{comms.pp.get(), grid.PpGroup(r)},
        std::pair{comms.tp.get(), grid.TpGroup(r)}}) {
    std::vector<int32_t> mine = {r}, members(comm->size());
    comm->AllGather(I32(mine), I32(members))->Wait();
    EXPECT_EQ(std::vector<int>(members.begin(), members.end()), expected) << comm->name();
  }
  EXPECT_EQ(comms.dp->name().rfind(detail::StrCat("dp group of ", n / 2), 0), 0u);
  EXPECT_EQ(comms.tp->name().rfind("tp group of 2", 0), 0u);
}

// Chunk j of rank r's input lands in chunk r of rank j's output (MPI_Alltoall), for fp32 and
// as raw 16-bit patterns; the bus bytes are the n - 1 chunks sent.
TEST(MpiCommunicatorTest, AllToAllSendsChunkJToRankJ) {
  Communicator& w = World();
  const int n = w.size(), r = w.rank();
  const int chunk = 257;
  std::vector<float> in(chunk * n), out(chunk * n, -1.0f);
  for (int j = 0; j < n; ++j) {
    for (int k = 0; k < chunk; ++k)
      in[j * chunk + k] = static_cast<float>(r * 100000 + j * 1000 + k);
  }
  const CommStats before = w.stats();
  w.AllToAll(F32(in), F32(out))->Wait();
  const CommStats after = w.stats();
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < chunk; ++k) ASSERT_EQ(out[i * chunk + k], i * 100000 + r * 1000 + k);
  }
  EXPECT_EQ(after.Bytes(OpKind::kAllToAll) - before.Bytes(OpKind::kAllToAll),
            (n - 1) * 4 * chunk * n / n);
  std::vector<uint16_t> h_in(3 * n), h_out(3 * n);
  for (int i = 0; i < 3 * n; ++i) h_in[i] = static_cast<uint16_t>(r * 256 + i / 3);
  w.AllToAll(Tensor(h_in.data(), DType::kBF16, {3 * n}),
             Tensor(h_out.data(), DType::kBF16, {3 * n}))
      ->Wait();
  for (int i = 0; i < 3 * n; ++i) EXPECT_EQ(h_out[i], (i / 3) * 256 + r);
  std::vector<float> odd(n + 1);
  EXPECT_THROW(w.AllToAll(F32(odd), F32(odd)), Error);
}

TEST(MpiCommunicatorTest, ByteCountsEqualTheFormulas) {
  Communicator& w = World();
  const int64_t n = w.size();
  const int64_t floats = 3000 * n;
  std::vector<float> buf(floats, 1.0f), shard(floats / n, 1.0f);
  const CommStats before = w.stats();
  w.AllReduce(F32(buf))->Wait();
  w.ReduceScatter(F32(buf), F32(shard))->Wait();
  w.AllGather(F32(shard), F32(buf))->Wait();
  w.Broadcast(F32(shard), 0)->Wait();
  w.Barrier()->Wait();
  const CommStats after = w.stats();
  auto delta = [&](OpKind k) { return after.Bytes(k) - before.Bytes(k); };
  EXPECT_EQ(delta(OpKind::kAllReduce), 2 * (n - 1) * 4 * floats / n);
  EXPECT_EQ(delta(OpKind::kReduceScatter), (n - 1) * 4 * floats / n);
  EXPECT_EQ(delta(OpKind::kAllGather), (n - 1) * 4 * floats / n);
  EXPECT_EQ(delta(OpKind::kBroadcast), 4 * floats / n);
  EXPECT_EQ(delta(OpKind::kBarrier), 0);
  EXPECT_EQ(after.ops[static_cast<int>(OpKind::kBarrier)] -
                before.ops[static_cast<int>(OpKind::kBarrier)],
            1);
  EXPECT_EQ(after.TotalBytes() - before.TotalBytes(), (4 * (n - 1) * 4 * floats + 4 * floats) / n);
}

}  // namespace
}  // namespace ztrain::comm
