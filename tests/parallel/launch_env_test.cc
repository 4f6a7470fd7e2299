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
  const LaunchEnv env = Detect({{"SLURM_STEP_ID", "0"},
                                {"SLURM_NTASKS", "14"},
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
  EXPECT_EQ(Detect({{"SLURM_STEP_ID", "0"},
                    {"SLURM_NTASKS", "8"},
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
  EXPECT_NE(ErrorOf({{"SLURM_STEP_ID", "0"},
                     {"SLURM_NTASKS", "4"},
                     {"SLURM_PROCID", "0"},
                     {"SLURM_TASKS_PER_NODE", "2(x"}})
                .find("SLURM_TASKS_PER_NODE"),
            std::string::npos);
}

// Rank 5 of 8, four per node (the second node): srun, mpirun and torchrun describe it with
// their own variables, and all give the same place in the job.
TEST(LaunchEnvTest, EveryLauncherGivesTheSamePlace) {
  const LaunchEnv slurm = Detect({{"SLURM_STEP_ID", "0"},
                                  {"SLURM_NTASKS", "8"},
                                  {"SLURM_PROCID", "5"},
                                  {"SLURM_LOCALID", "1"},
                                  {"SLURM_NODEID", "1"},
                                  {"SLURM_JOB_NUM_NODES", "2"},
                                  {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"}});
  const LaunchEnv openmpi = Detect({{"OMPI_COMM_WORLD_SIZE", "8"},
                                    {"OMPI_COMM_WORLD_RANK", "5"},
                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                    {"SLURM_NTASKS", "8"},  // mpirun inside an allocation
                                    {"SLURM_PROCID", "0"}});
  const LaunchEnv torchrun = Detect(
      {{"WORLD_SIZE", "8"}, {"RANK", "5"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}});
  for (const LaunchEnv* env : {&slurm, &openmpi, &torchrun}) {
    EXPECT_EQ(env->world_size, 8) << env->launcher;
    EXPECT_EQ(env->rank, 5) << env->launcher;
    EXPECT_EQ(env->local_rank, 1) << env->launcher;
    EXPECT_EQ(env->local_size, 4) << env->launcher;
  }
  EXPECT_EQ(slurm.launcher, "slurm");
  EXPECT_EQ(openmpi.launcher, "openmpi");
  EXPECT_EQ(torchrun.launcher, "torchrun");
}

// The batch script of `sbatch -n 16` sees the allocation's SLURM_NTASKS and SLURM_PROCID 0 but
// is no task of a step (no SLURM_STEP_ID): ztrain run there without srun is one process, or
// what torchrun's variables say.
TEST(LaunchEnvTest, TheBatchScriptIsNoTaskOfTheAllocation) {
  const Env batch = {{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS", "16"}, {"SLURM_PROCID", "0"}};
  const LaunchEnv alone = Detect(batch);
  EXPECT_EQ(alone.launcher, "none");
  EXPECT_EQ(alone.world_size, 1);
  EXPECT_EQ(alone.slurm_job_id, "7");
  Env torchrun = batch;
  torchrun.insert({{"WORLD_SIZE", "4"}, {"RANK", "2"}});
  EXPECT_EQ(Detect(torchrun).launcher, "torchrun");
  EXPECT_EQ(Detect(torchrun).world_size, 4);
}

// Inside a SLURM job, whatever started the ranks: the job, its requeues, the CPUs and GPUs of
// a task.
TEST(LaunchEnvTest, ReadsTheSlurmJob) {
  const LaunchEnv env = Detect({{"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_RANK", "0"},
                                {"SLURM_JOB_ID", "4242"},
                                {"SLURM_RESTART_COUNT", "3"},
                                {"SLURM_CPUS_PER_TASK", "8"},
                                {"SLURM_GPUS_PER_TASK", "a100:2"}});
  EXPECT_EQ(env.slurm_job_id, "4242");
  EXPECT_EQ(env.slurm_restart_count, 3);
  EXPECT_EQ(env.cpus_per_task, 8);
  EXPECT_EQ(env.gpus_per_task, 2);
  EXPECT_EQ(Detect({{"SLURM_GPUS_PER_TASK", "1"}}).gpus_per_task, 1);
  const LaunchEnv none = Detect({});
  EXPECT_EQ(none.slurm_job_id, "");
  EXPECT_EQ(none.slurm_restart_count, 0);
  EXPECT_EQ(none.cpus_per_task, 0);
  EXPECT_EQ(none.gpus_per_task, 0);
  EXPECT_NE(ErrorOf({{"SLURM_CPUS_PER_TASK", "many"}}).find("SLURM_CPUS_PER_TASK='many'"),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"SLURM_GPUS_PER_TASK", "a100:"}}).find("SLURM_GPUS_PER_TASK='a100:'"),
            std::string::npos);
}

}  // namespace
}  // namespace ztrain
