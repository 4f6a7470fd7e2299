// Note [Frozen regions] across real ranks (comm_mpi_test, at 2 and 4): at stage 3 each rank
// holds its shard of the region, exactly its bytes of the region one process holds whole, and
// the gather gives every rank that whole region back, a parameter cut by a shard boundary
// included.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "tests/parallel/mpi_test_env.h"
#include "tests/parallel/zero/frozen_regions_test_util.h"

namespace ztrain::zero {
namespace {

using comm::test::World;

TEST(FrozenRegionsMpiTest, ShardsAreTheRanksBytesOfTheWholeRegion) {
  comm::Communicator& dp = World();
  // The reference: one rank holding the same region whole (padded for dp ranks).
  const std::unique_ptr<comm::Communicator> self = comm::MakeSelfCommunicator();
  test::HostRegions one(*self, /*sharded=*/false);
  test::HostRegions sharded(dp, /*sharded=*/true);
  ASSERT_LE(one.padded, sharded.padded);
  test::RecordingFill fill_one, fill_sharded;
  one.regions->SetHeld(0, fill_one.Fill());
  sharded.regions->SetHeld(0, fill_sharded.Fill());
  std::vector<uint8_t> reference = one.regions->Whole(0);
  reference.resize(static_cast<size_t>(sharded.padded), 0);

  const int64_t shard = sharded.padded / dp.size();
  ASSERT_EQ(sharded.regions->held(0).nbytes(), static_cast<size_t>(shard));
  EXPECT_EQ(std::memcmp(sharded.regions->held(0).data(), reference.data() + dp.rank() * shard,
                        static_cast<size_t>(shard)),
            0);
  const std::vector<uint8_t> whole = sharded.regions->Whole(0);  // collective
  EXPECT_EQ(whole, reference);
  // A rank asks only for the parameters with bytes in its shard.
  for (const std::string& name : fill_sharded.asked) {
    bool held = false;
    for (const FrozenParam& p : test::ThreeFrozenParams()) {
      const int64_t end = p.offset + sharded.regions->Bytes(p.spec);
      held = held ||
             (p.spec.name == name && p.offset < (dp.rank() + 1) * shard && end > dp.rank() * shard);
    }
    EXPECT_TRUE(held) << name << " on rank " << dp.rank();
  }
}

}  // namespace
}  // namespace ztrain::zero
