// SelectDevice: every branch of the `device` setting against fake GPU counts (Note [One rank
// per GPU]), and the Trainer handing the Engine the concrete device it chose.
#include "run/device_select.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "kernels/ops.h"
#include "run/trainer.h"
#include "tests/engine/test_model.h"
#include "tests/expect_error.h"

namespace ztrain {
namespace {

using testing::ExpectErrorWith;

void ExpectConfigError(const std::string& setting, int local_rank, int local_size, int gpus,
                       const std::vector<std::string>& parts) {
  ExpectErrorWith<ConfigError>([&] { SelectDevice(setting, local_rank, local_size, gpus); },
                               parts);
}

TEST(DeviceSelectTest, CpuIsTheCpuWhateverTheGpus) {
  for (int gpus : {0, 1, 8}) {
    const DeviceChoice c = SelectDevice("cpu", 1, 2, gpus);
    EXPECT_EQ(c.device, Device::Cpu()) << gpus;
    EXPECT_EQ(c.reason, "set in the config");
  }
}

TEST(DeviceSelectTest, CudaTakesTheGpuOfTheLocalRank) {
  for (int local_rank : {0, 1, 3}) {
    const DeviceChoice c = SelectDevice("cuda", local_rank, 4, 8);
    EXPECT_EQ(c.device, Device::Cuda(local_rank));
    EXPECT_EQ(c.reason, "local rank " + std::to_string(local_rank) + " of 4, 8 GPUs visible");
  }
  EXPECT_EQ(SelectDevice("cuda", 0, 1, 1).reason, "local rank 0 of 1, 1 GPU visible");
}

TEST(DeviceSelectTest, CudaWithoutAGpuSaysToUseTheCpu) {
  ExpectConfigError("cuda", 0, 1, 0,
                    {"device is \"cuda\"", "no CUDA device is visible", "CUDA_VISIBLE_DEVICES",
                     "use \"device\": \"cpu\""});
  ExpectConfigError("cuda:0", 0, 1, 0, {"device is \"cuda:0\"", "no CUDA device is visible"});
}

TEST(DeviceSelectTest, CudaWithMoreRanksThanGpusFailsOnEveryRankOfTheNode) {
  ExpectConfigError("cuda", 3, 4, 2,
                    {"one rank per GPU", "local rank 3 has no GPU, 2 visible",
                     "for the 4 ranks on this node", "launch at most 2 ranks per node",
                     "\"device\": \"cpu\""});
  // A rank with a GPU fails too, so no rank waits for the others in NCCL's setup.
  ExpectConfigError("cuda", 0, 4, 2, {"one rank per GPU", "local rank 3 has no GPU"});
  // One GPU per rank may mean the launcher bound one to each: then "cuda:0" is the fix.
  ExpectConfigError("cuda", 1, 2, 1, {"local rank 1 has no GPU, 1 visible", "\"cuda:0\""});
}

TEST(DeviceSelectTest, CudaIndexTakesThatGpuOnEveryLocalRank) {
  const DeviceChoice c = SelectDevice("cuda:1", 0, 1, 2);
  EXPECT_EQ(c.device, Device::Cuda(1));
  EXPECT_EQ(c.reason, "set in the config; local rank 0 of 1, 2 GPUs visible");
  EXPECT_EQ(SelectDevice("cuda:0", 3, 4, 1).device, Device::Cuda(0));  // srun-bound GPUs
  ExpectConfigError("cuda:2", 0, 1, 2,
                    {"device is \"cuda:2\"", "only 2 GPUs visible", "cuda:0 to cuda:1",
                     "\"cuda\"", "\"cpu\""});
}

TEST(DeviceSelectTest, AutoTakesOneGpuPerLocalRankWhenThereAreEnough) {
  EXPECT_EQ(SelectDevice("auto", 0, 1, 1).device, Device::Cuda(0));
  const DeviceChoice c = SelectDevice("auto", 2, 4, 4);
  EXPECT_EQ(c.device, Device::Cuda(2));
  EXPECT_EQ(c.reason, "local rank 2 of 4, 4 GPUs visible");
  EXPECT_EQ(SelectDevice("auto", 1, 2, 8).device, Device::Cuda(1));
}

TEST(DeviceSelectTest, AutoFallsBackToTheCpuAndSaysWhy) {
  const DeviceChoice none = SelectDevice("auto", 0, 1, 0);
  EXPECT_EQ(none.device, Device::Cpu());
  EXPECT_EQ(none.reason, "no CUDA device visible");
  // Every rank of the node falls back, also those whose local rank has a GPU.
  for (int local_rank : {0, 3}) {
    const DeviceChoice few = SelectDevice("auto", local_rank, 4, 2);
    EXPECT_EQ(few.device, Device::Cpu());
    EXPECT_EQ(few.reason,
              "4 ranks on this node but 2 GPUs: running on the CPU; set \"device\": \"cuda\" to "
              "fail instead");
  }
}

TEST(DeviceSelectTest, OtherSettingsAreConfigErrorsListingTheAcceptedOnes) {
  for (const char* bad : {"gpu", "CUDA", "cuda:", "cuda:-1", "cuda:1x", "cuda: 1", " cpu", ""}) {
    ExpectConfigError(bad, 0, 1, 1,
                      {"device: expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"",
                       "got \"" + std::string(bad) + "\""});
  }
}

TEST(DeviceSelectTest, LaunchEnvUsesTheGpusThisProcessSees) {
  LaunchEnv env;  // one process
  const int gpus = kernels::CudaDeviceCount();
  for (const char* setting : {"auto", "cpu"}) {
    const DeviceChoice want = SelectDevice(setting, 0, 1, gpus);
    const DeviceChoice got = SelectDevice(setting, env);
    EXPECT_EQ(got.device, want.device) << setting;
    EXPECT_EQ(got.reason, want.reason) << setting;
  }
}

// srun --gpus-per-task=1: each of the node's 4 tasks sees only its own GPU and takes it;
// seeing more GPUs than it was given (no binding), a task picks by local rank as before.
TEST(DeviceSelectTest, ATaskWithItsOwnGpusTakesTheFirst) {
  LaunchEnv env;
  env.launcher = "slurm";
  env.local_rank = 3;
  env.local_size = 4;
  env.gpus_per_task = 1;
  for (const char* setting : {"auto", "cuda", "cuda:0"}) {
    const DeviceChoice got = SelectDevice(setting, env, 1);
    EXPECT_EQ(got.device, Device::Cuda(0)) << setting;
  }
  EXPECT_EQ(SelectDevice("auto", env, 1).reason,
            "srun --gpus-per-task=1: this task's own GPU (local rank 3 of 4)");
  EXPECT_EQ(SelectDevice("auto", env, 4).device, Device::Cuda(3));
  EXPECT_EQ(SelectDevice("cpu", env, 1).device, Device::Cpu());
  env.gpus_per_task = 0;  // one GPU visible to 4 ranks and nothing says it is theirs alone
  EXPECT_EQ(SelectDevice("auto", env, 1).device, Device::Cpu());
}

// The Engine reads a concrete device from its config: the Trainer writes its choice there.
TEST(DeviceSelectTest, TrainerGivesTheEngineTheDeviceItChose) {
  nlohmann::json j = testing::TinyConfigJson();
  j["training"]["steps"] = 1;
  Trainer auto_trainer(ParseConfig(j), nullptr, LaunchEnv{});
  const DeviceChoice want = SelectDevice("auto", 0, 1, kernels::CudaDeviceCount());
  EXPECT_EQ(auto_trainer.device().device, want.device);
  EXPECT_EQ(auto_trainer.engine().config().device, want.device.ToString());

  j["device"] = "cpu";
  Trainer cpu_trainer(ParseConfig(j), nullptr, LaunchEnv{});
  EXPECT_EQ(cpu_trainer.engine().config().device, "cpu");

  if (kernels::CudaDeviceCount() > 0) return;  // "cuda" would train there
  j["device"] = "cuda";
  ExpectErrorWith<ConfigError>([&] { Trainer t(ParseConfig(j), nullptr, LaunchEnv{}); },
                               {"device is \"cuda\"", "no CUDA device is visible"});
}

}  // namespace
}  // namespace ztrain
