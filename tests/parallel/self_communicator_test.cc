#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "parallel/comm/comm_util.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/mpi/mpi_communicator.h"

namespace ztrain::comm {
namespace {

Tensor F32(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}

TEST(SelfCommunicatorTest, AllReduceLeavesDataAndMovesNoBytes) {
  auto comm = MakeSelfCommunicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->name(), "world of 1");
  std::vector<float> v = {1.5f, -2.0f, 3.0f};
  WorkPtr w = comm->AllReduce(F32(v));
  EXPECT_TRUE(w->Done());
  w->Wait();
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  comm->AllReduce(F32(v), ReduceOp::kMax)->Wait();
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  const CommStats stats = comm->stats();
  EXPECT_EQ(stats.TotalBytes(), 0);
  EXPECT_EQ(stats.ops[static_cast<int>(OpKind::kAllReduce)], 2);
}

TEST(SelfCommunicatorTest, GatherAndScatterCopy) {
  auto comm = MakeSelfCommunicator();
  std::vector<float> in = {1, 2, 3, 4}, out(4, 0.0f);
  comm->ReduceScatter(F32(in), F32(out))->Wait();
  EXPECT_EQ(out, in);
  std::vector<float> gathered(4, 0.0f);
  comm->AllGather(F32(in), F32(gathered))->Wait();
  EXPECT_EQ(gathered, in);
  comm->AllGather(F32(in), F32(in))->Wait();  // in place
  EXPECT_EQ(in, (std::vector<float>{1, 2, 3, 4}));
  comm->Broadcast(F32(in), 0)->Wait();
  comm->Barrier()->Wait();
  std::vector<float> exchanged(4, 0.0f);
  comm->AllToAll(F32(in), F32(exchanged))->Wait();  // its one chunk stays with it
  EXPECT_EQ(exchanged, in);
  EXPECT_EQ(comm->stats().TotalBytes(), 0);
  EXPECT_EQ(comm->stats().ops[static_cast<int>(OpKind::kAllGather)], 2);
  EXPECT_EQ(comm->stats().ops[static_cast<int>(OpKind::kAllToAll)], 1);
}

TEST(SelfCommunicatorTest, RefusesBadArgumentsWithMessages) {
  auto comm = MakeSelfCommunicator();
  std::vector<float> in(4), out(3);
  EXPECT_THROW(comm->ReduceScatter(F32(in), F32(out)), Error);
  EXPECT_THROW(comm->AllGather(F32(in), F32(out)), Error);
  EXPECT_THROW(comm->Broadcast(F32(in), 1), Error);
  EXPECT_THROW(comm->Send(F32(in), 0, 0), Error);
  EXPECT_THROW(comm->Recv(F32(in), 1, 0), Error);
  std::vector<uint16_t> half(4);
  try {
    comm->AllReduce(Tensor(half.data(), DType::kBF16, {4}));
    FAIL() << "bf16 all-reduce accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp32 or int32"), std::string::npos) << e.what();
  }
}

TEST(SelfCommunicatorTest, SplitKeepsTimeoutAndTakesLabel) {
  auto comm = MakeSelfCommunicator();
  comm->set_timeout(std::chrono::milliseconds(1234));
  auto split = comm->Split(3, 0);
  EXPECT_EQ(split->size(), 1);
  EXPECT_EQ(split->timeout(), std::chrono::milliseconds(1234));
  split->set_label("dp group");
  EXPECT_EQ(split->name(), "dp group of 1 (world ranks 0)");
}

TEST(CommUtilTest, BusBytesFollowTheRingConvention) {
  using detail::BusBytes;
  const int64_t n = 4 * 1000;  // 1000 floats
  EXPECT_EQ(BusBytes(OpKind::kAllReduce, n, 4), 2 * 3 * n / 4);
  EXPECT_EQ(BusBytes(OpKind::kAllReduce, n, 2), n);
  EXPECT_EQ(BusBytes(OpKind::kReduceScatter, n, 4), 3 * n / 4);
  EXPECT_EQ(BusBytes(OpKind::kAllGather, n, 8), 7 * n / 8);
  EXPECT_EQ(BusBytes(OpKind::kAllToAll, n, 4), 3 * n / 4);
  EXPECT_EQ(BusBytes(OpKind::kBroadcast, n, 4), n);
  EXPECT_EQ(BusBytes(OpKind::kSend, n, 2), n);
  EXPECT_EQ(BusBytes(OpKind::kBarrier, 0, 4), 0);
  EXPECT_EQ(BusBytes(OpKind::kAllReduce, n, 1), 0);
}

TEST(CommUtilTest, GroupNamesListWorldRanks) {
  EXPECT_EQ(detail::GroupName("world", {0, 1, 2, 3}), "world of 4");
  EXPECT_EQ(detail::GroupName("dp group", {0, 2, 4, 6}), "dp group of 4 (world ranks 0,2,4,6)");
  std::vector<int> many(40);
  std::iota(many.begin(), many.end(), 0);
  EXPECT_EQ(detail::GroupName("group", many), "group of 40 (world ranks 0,1,2,3,4,5,6,7,...,39)");
}

TEST(MpiAvailabilityTest, MakeMpiWorldWithoutMpiSaysHowToFix) {
  if (HaveMpi()) GTEST_SKIP() << "this build has MPI; the MPI tests run under mpirun";
  try {
    MakeMpiWorld(std::chrono::seconds(1));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("-DZTRAIN_WITH_MPI=ON"), std::string::npos);
  }
}

}  // namespace
}  // namespace ztrain::comm
