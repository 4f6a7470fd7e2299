#include "parallel/launch_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/error.h"

namespace ztrain {
namespace {

using Env = std::map<std::string, std::string>;

LaunchEnv Detect(const Env& env) {
  return DetectLaunchEnv([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string ErrorOf(const Env& env) {
  try {
    Detect(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(LaunchEnvTest, NoLauncherIsAWorldOfOne) {
  const LaunchEnv env = Detect({{"HOME", "/root"}, {"RANK", "3"}});  // RANK alone is not torchrun
  EXPECT_EQ(env.launcher, "none");
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_size, 1);
}

TEST(LaunchEnvTest, ReadsOpenMpi) {
  const LaunchEnv env = Detect({{"OMPI_COMM_WORLD_SIZE", "8"},
                                {"OMPI_COMM_WORLD_RANK", "5"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(env.launcher, "openmpi");
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_size, 4);
}

TEST(LaunchEnvTest, OpenMpiWinsOverSlurmAndTorchrun) {
  // mpirun inside a SLURM allocation, with stray torchrun variables.
  const LaunchEnv env = Detect({{"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_RANK", "1"},
                                {"SLURM_NTASKS", "16"},
                                {"SLURM_PROCID", "0"},
                                {"WORLD_SIZE", "4"},
                                {"RANK", "0"}});
  EXPECT_EQ(env.launcher, "openmpi");
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.rank, 1);
  // Local variables missing: one node.
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_size, 2);
}

TEST(LaunchEnvTest, ReadsSlurmWithTasksPerNodeList) {
  // 3 nodes with 4 tasks and one with 2: the last node holds ranks 12 and 13.
  const LaunchEnv env = Detect({{"SLURM_NTASKS", "14"},
                                {"SLURM_PROCID", "13"},
                                {"SLURM_LOCALID", "1"},
                                {"SLURM_NODEID", "3"},
                                {"SLURM_STEP_TASKS_PER_NODE", "4(x3),2"},
                                {"SLURM_TASKS_PER_NODE", "99"}});
  EXPECT_EQ(env.launcher, "slurm");
  EXPECT_EQ(env.world_size, 14);
  EXPECT_EQ(env.rank, 13);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_size, 2);
  EXPECT_EQ(Detect({{"SLURM_NTASKS", "8"},
                    {"SLURM_PROCID", "2"},
                    {"SLURM_LOCALID", "2"},
                    {"SLURM_TASKS_PER_NODE", "4(x2)"}})
                .local_size,
            4);
}

TEST(LaunchEnvTest, ReadsTorchrun) {
  const LaunchEnv env =
      Detect({{"WORLD_SIZE", "4"}, {"RANK", "3"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_size, 2);
}

TEST(LaunchEnvTest, ErrorsNameTheVariable) {
  EXPECT_NE(ErrorOf({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "4"}})
                .find("OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4"),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"WORLD_SIZE", "four"}, {"RANK", "0"}}).find("WORLD_SIZE='four'"),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"WORLD_SIZE", "4"}, {"RANK", "-1"}}).find("RANK='-1'"), std::string::npos);
  EXPECT_NE(ErrorOf({{"WORLD_SIZE", "4"}, {"RANK", "1x"}}).find("RANK='1x'"), std::string::npos);
  EXPECT_NE(ErrorOf({{"WORLD_SIZE", "4"}}).find("RANK is not"), std::string::npos);
  EXPECT_NE(ErrorOf({{"WORLD_SIZE", "0"}, {"RANK", "0"}}).find("WORLD_SIZE=0 must be at least 1"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf({{"WORLD_SIZE", "4"}, {"RANK", "1"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}})
          .find("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
      std::string::npos);
  EXPECT_NE(ErrorOf({{"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}, {"SLURM_TASKS_PER_NODE", "2(x"}})
                .find("SLURM_TASKS_PER_NODE"),
            std::string::npos);
}

}  // namespace
}  // namespace ztrain
