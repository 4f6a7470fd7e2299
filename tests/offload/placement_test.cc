// Note [State placement]: where every combination of stage, offload device, pin_memory and
// backend puts each kind of state, against the rules written out in offload/placement.h.
#include "offload/placement.h"

#include <gtest/gtest.h>

#include <string>

namespace ztrain::offload {
namespace {

ZeroConfig Zero(int stage, const std::string& param, const std::string& optimizer,
                bool pin = false) {
  ZeroConfig z;
  z.stage = stage;
  z.offload_param.device = param;
  z.offload_param.pin_memory = pin;
  z.offload_optimizer.device = optimizer;
  z.offload_optimizer.pin_memory = pin;
  return z;
}

TEST(PlacementTest, NoOffloadKeepsEverythingOnTheDevice) {
  for (int stage = 0; stage <= 3; ++stage) {
    const Placement gpu = PlaceState(Zero(stage, "none", "none"), /*on_device=*/true);
    EXPECT_EQ(gpu.params, Place::kDevice);
    EXPECT_EQ(gpu.frozen(), Place::kDevice);
    EXPECT_EQ(gpu.optimizer, Place::kDevice);
    EXPECT_FALSE(gpu.host_adam);
    EXPECT_FALSE(gpu.host_master);
  }
}

TEST(PlacementTest, TheCpuBackendStepsOnTheHostWithOptimizerStateInHostMemory) {
  const Placement cpu = PlaceState(Zero(2, "none", "none"), /*on_device=*/false);
  EXPECT_EQ(cpu.params, Place::kDevice);  // the CPU backend's device memory
  EXPECT_EQ(cpu.optimizer, Place::kHost);
  EXPECT_TRUE(cpu.host_adam);
  EXPECT_FALSE(cpu.host_master);  // the parameters are host memory already
}

TEST(PlacementTest, OptimizerOffload) {
  const Placement host = PlaceState(Zero(1, "none", "cpu"), true);
  EXPECT_EQ(host.optimizer, Place::kHost);
  EXPECT_EQ(host.params, Place::kDevice);
  EXPECT_TRUE(host.host_adam);
  EXPECT_TRUE(host.host_master);  // parameters on the device, AdamW on the host
  EXPECT_EQ(PlaceState(Zero(2, "none", "cpu", /*pin=*/true), true).optimizer, Place::kPinned);
  EXPECT_EQ(PlaceState(Zero(3, "none", "nvme"), true).optimizer, Place::kNvme);
  EXPECT_EQ(PlaceState(Zero(3, "none", "nvme"), false).optimizer, Place::kNvme);
}

TEST(PlacementTest, ParameterOffloadAtStageThree) {
  const Placement host = PlaceState(Zero(3, "cpu", "none"), true);
  EXPECT_EQ(host.params, Place::kHost);
  EXPECT_EQ(host.frozen(), Place::kHost);
  EXPECT_TRUE(host.host_adam);     // offloaded parameters are stepped on the host
  EXPECT_FALSE(host.host_master);  // the host shard is the master
  EXPECT_EQ(host.optimizer, Place::kHost);
  const Placement pinned = PlaceState(Zero(3, "cpu", "none", /*pin=*/true), true);
  EXPECT_EQ(pinned.params, Place::kPinned);
  EXPECT_EQ(pinned.frozen(), Place::kPinned);
  const Placement nvme = PlaceState(Zero(3, "nvme", "nvme"), true);
  EXPECT_EQ(nvme.params, Place::kNvme);
  EXPECT_EQ(nvme.frozen(), Place::kHost);  // frozen shards are not swapped
  EXPECT_EQ(nvme.optimizer, Place::kNvme);
  EXPECT_TRUE(nvme.params_offloaded());
}

TEST(PlacementTest, ParameterOffloadBelowStageThreeIsIgnored) {
  const Placement p = PlaceState(Zero(2, "nvme", "none"), true);
  EXPECT_EQ(p.params, Place::kDevice);
  EXPECT_FALSE(p.host_adam);
}

TEST(PlacementTest, PlacesHaveNames) {
  EXPECT_STREQ(PlaceName(Place::kDevice), "device");
  EXPECT_STREQ(PlaceName(Place::kHost), "host");
  EXPECT_STREQ(PlaceName(Place::kPinned), "pinned host");
  EXPECT_STREQ(PlaceName(Place::kNvme), "NVMe");
}

TEST(PlacementTest, TheHostOffloadLineSaysWhatIsThereAndHowMuchIsPinned) {
  ZeroConfig z;
  z.stage = 3;
  EXPECT_EQ(DescribeHostOffload(PlaceState(z, false), z, 0, 0), "");  // nothing offloaded
  z.offload_optimizer.device = "cpu";
  z.offload_param.device = "cpu";
  const Placement at = PlaceState(z, /*on_device=*/true);
  EXPECT_EQ(DescribeHostOffload(at, z, 0, 0),
            "offload: optimizer state and parameter shards in host memory (pin_memory off)");
  EXPECT_EQ(DescribeHostOffload(at, z, 3 << 20, 0),
            "offload: optimizer state and parameter shards in host memory, 3.00 MiB pinned");
  const std::string refused = DescribeHostOffload(at, z, 1 << 20, 2 << 20);
  EXPECT_NE(refused.find("2.00 MiB not (RLIMIT_MEMLOCK too small: raise `ulimit -l`)"),
            std::string::npos)
      << refused;
  z.offload_param.device = "none";
  EXPECT_EQ(DescribeHostOffload(PlaceState(z, true), z, 0, 0),
            "offload: optimizer state in host memory (pin_memory off)");
}

}  // namespace
}  // namespace ztrain::offload
