#include "launcher/slurm_job.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>

#include "core/logging.h"

namespace ztrain::launcher {

void LogSlurmJob(const LaunchEnv& env) {
  if (env.slurm_job_id.empty()) return;
  Log().info("SLURM job {} (restart {}{}), {} rank {} of {} on {}", env.slurm_job_id,
             env.slurm_restart_count,
             env.slurm_restart_count > 0 ? ": requeued, resuming from its checkpoints" : "",
             env.launcher, env.rank, env.world_size, env.host.empty() ? "?" : env.host);
}

bool ResumesAfterRequeue(const LaunchEnv& env, const Config& config) {
  return !env.slurm_job_id.empty() && env.slurm_restart_count > 0 &&
         !config.checkpoint.dir.empty();
}

bool RequeuesOnUsr1(const LaunchEnv& env, const Config& config) {
  return !env.slurm_job_id.empty() && !config.checkpoint.dir.empty() &&
         config.checkpoint.slurm_requeue;
}

std::string SrunMpiProblem(const char* mpi_type, const char* pmix_rank) {
  const std::string type = mpi_type == nullptr ? "" : mpi_type;
  if (pmix_rank != nullptr || type.rfind("pmix", 0) == 0) return "";
  return "ztrain: srun started these ranks with " +
         (type.empty() ? std::string("no MPI plugin") : "--mpi=" + type) +
         ", and OpenMPI builds without SLURM's PMI2 library (Debian's and most others) cannot "
         "start under it (MPI_Init_thread fails below, if it does): launch with srun "
         "--mpi=pmix, or set MpiDefault=pmix in slurm.conf";
}

std::string RequeueSlurmJob(const std::string& job_id) {
  for (char ch : job_id) {
    if (ch < '0' || ch > '9') return "SLURM_JOB_ID '" + job_id + "' is not a job id";
  }
  const std::string command = "scontrol requeue " + job_id + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "cannot run scontrol (" + command + ")";
  std::string said;
  std::array<char, 256> buffer;
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) said += buffer.data();
  const int status = pclose(pipe);
  if (status == 0) return "";
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  std::string why = "`scontrol requeue " + job_id + "` failed";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    why += " (scontrol is not on PATH)";
  } else if (!said.empty()) {
    why += ": " + said;
  }
  return why +
         "; submit such jobs with sbatch --requeue (or set checkpoint.slurm_requeue false); "
         "to continue this one, resubmit it with --resume (or checkpoint.resume true): it "
         "goes on from the checkpoint just saved";
}

}  // namespace ztrain::launcher
