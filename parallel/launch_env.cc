#include "parallel/launch_env.h"

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string_view>

#include <unistd.h>

#include "core/error.h"

namespace ztrain {
namespace {

using Getenv = std::function<const char*(const char*)>;

// The variables one launcher sets.
struct Vars {
  const char* launcher;
  const char* size;
  const char* rank;
  const char* local_rank;
  const char* local_size;  // nullptr: SLURM's tasks-per-node list instead
};
constexpr Vars kOpenMpi{"openmpi", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr Vars kSlurm{"slurm", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", nullptr};
constexpr Vars kTorchrun{"torchrun", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};

// Parses a whole string as a non-negative int; nullopt when it is not one.
std::optional<int> ParseInt(std::string_view s) {
  int value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty() || value < 0) return {};
  return value;
}

std::optional<int> ReadInt(const Getenv& getenv, const char* name) {
  const char* value = getenv(name);
  if (value == nullptr) return {};
  auto parsed = ParseInt(value);
  ZTRAIN_CHECK(parsed, "environment variable ", name, "='", value,
               "' is not a non-negative integer; fix the launch command or unset it");
  return parsed;
}

// Expands SLURM's "2(x3),1" (tasks on each node) and returns the entry of node `node`.
int SlurmTasksOnNode(const char* name, std::string_view list, int node) {
  int index = 0;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    std::optional<int> repeat = 1;
    const size_t paren = item.find("(x");
    if (paren != std::string_view::npos && item.back() == ')') {
      repeat = ParseInt(item.substr(paren + 2, item.size() - paren - 3));
      item = item.substr(0, paren);
    }
    const auto tasks = ParseInt(item);
    ZTRAIN_CHECK(tasks && repeat, "environment variable ", name, " has the malformed entry '", item,
                 "' (expected a list like 2(x3),1)");
    if (node < index + *repeat) return *tasks;
    index += *repeat;
  }
  ZTRAIN_CHECK(false, "environment variable ", name, " lists ", index,
               " nodes but SLURM_NODEID is ", node);
  return 0;
}

int SlurmLocalSize(const Getenv& getenv, int fallback) {
  const char* name = "SLURM_STEP_TASKS_PER_NODE";
  const char* list = getenv(name);
  if (list == nullptr) list = getenv(name = "SLURM_TASKS_PER_NODE");
  if (list == nullptr) return fallback;
  return SlurmTasksOnNode(name, list, ReadInt(getenv, "SLURM_NODEID").value_or(0));
}

LaunchEnv Read(const Getenv& getenv, const Vars& vars) {
  LaunchEnv env;
  env.launcher = vars.launcher;
  env.world_size = *ReadInt(getenv, vars.size);
  const auto rank = ReadInt(getenv, vars.rank);
  ZTRAIN_CHECK(rank, vars.size, " is set but ", vars.rank, " is not: the ", vars.launcher,
               " environment is incomplete");
  env.rank = *rank;
  // Without local variables, assume every rank runs on this node.
  env.local_rank = ReadInt(getenv, vars.local_rank).value_or(env.rank);
  env.local_size = vars.local_size ? ReadInt(getenv, vars.local_size).value_or(env.world_size)
                                   : SlurmLocalSize(getenv, env.world_size);
  const char* local_size_name = vars.local_size ? vars.local_size : "SLURM's tasks per node";
  ZTRAIN_CHECK(env.world_size >= 1, vars.size, "=", env.world_size, " must be at least 1");
  ZTRAIN_CHECK(env.rank < env.world_size, vars.rank, "=", env.rank, " is not below ", vars.size,
               "=", env.world_size);
  ZTRAIN_CHECK(env.local_size >= 1 && env.local_size <= env.world_size, local_size_name, "=",
               env.local_size, " must be between 1 and ", vars.size, "=", env.world_size);
  ZTRAIN_CHECK(env.local_rank < env.local_size, vars.local_rank, "=", env.local_rank,
               " is not below ", local_size_name, "=", env.local_size);
  return env;
}

// SLURM_GPUS_PER_TASK may carry a type, "a100:1"; the count is after the last colon.
int GpusPerTask(const Getenv& getenv) {
  const char* value = getenv("SLURM_GPUS_PER_TASK");
  if (value == nullptr) return 0;
  std::string_view v(value);
  const size_t colon = v.rfind(':');
  const auto count = ParseInt(colon == std::string_view::npos ? v : v.substr(colon + 1));
  ZTRAIN_CHECK(count, "environment variable SLURM_GPUS_PER_TASK='", value,
               "' is not a GPU count (like 1 or a100:1)");
  return *count;
}

}  // namespace

LaunchEnv DetectLaunchEnv(const std::function<const char*(const char*)>& getenv) {
  LaunchEnv env;
  for (const Vars* vars : {&kOpenMpi, &kSlurm, &kTorchrun}) {
    // SLURM's rank variables describe this process only in a task of a job step (srun sets
    // SLURM_STEP_ID); in the batch script they describe the allocation.
    if (vars == &kSlurm && getenv("SLURM_STEP_ID") == nullptr) continue;
    if (getenv(vars->size) != nullptr) {
      env = Read(getenv, *vars);
      break;
    }
  }
  if (const char* job = getenv("SLURM_JOB_ID")) env.slurm_job_id = job;
  env.slurm_restart_count = ReadInt(getenv, "SLURM_RESTART_COUNT").value_or(0);
  env.cpus_per_task = ReadInt(getenv, "SLURM_CPUS_PER_TASK").value_or(0);
  env.gpus_per_task = GpusPerTask(getenv);
  return env;
}

LaunchEnv DetectLaunchEnv() {
  LaunchEnv env =
      DetectLaunchEnv([](const char* name) -> const char* { return std::getenv(name); });
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) {
    env.host = host;
    env.host = env.host.substr(0, env.host.find('.'));
  }
  return env;
}

}  // namespace ztrain
