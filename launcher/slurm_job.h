#pragma once
// What ztrain does inside a SLURM batch job (docs/slurm.md): it logs the job id and how often
// SLURM requeued it, a requeued job resumes from its checkpoints without being told, and
// after SIGUSR1 (sbatch --signal=USR1@120 before the time limit, scancel --signal=USR1) has
// saved a checkpoint the job requeues itself, so that it goes on where it stopped.
#include <string>

#include "core/config.h"
#include "parallel/launch_env.h"

namespace ztrain::launcher {

// Logs "SLURM job <id> (restart N), <launcher> rank R of W on <host>" inside a SLURM job.
void LogSlurmJob(const LaunchEnv& env);
// True when this is a SLURM job that SLURM requeued (SLURM_RESTART_COUNT > 0) and the config
// saves checkpoints: it resumes from the latest one (or starts afresh when there is none).
bool ResumesAfterRequeue(const LaunchEnv& env, const Config& config);
// True when a stop by SIGUSR1 requeues the job: a SLURM job with checkpoint.dir and
// checkpoint.slurm_requeue.
bool RequeuesOnUsr1(const LaunchEnv& env, const Config& config);
// For a task that srun started with several ranks: "" when srun bootstraps MPI through PMIx
// (a PMIx server gave the task `pmix_rank`, PMIX_RANK, as it does under --mpi=pmix or
// slurm.conf's MpiDefault=pmix; or `mpi_type`, srun's SLURM_MPI_TYPE, is pmix or pmix_v*),
// else a line naming the fix, which ztrain prints before MPI_Init: OpenMPI builds without
// SLURM's PMI2 library (Debian's, most) fail there under --mpi=pmi2 or none, saying only that
// OpenMPI lacks PMI support.
std::string SrunMpiProblem(const char* mpi_type, const char* pmix_rank);
// Runs `scontrol requeue <job_id>` (SLURM then ends this job's processes and queues it
// again); returns "" on success, or what failed and how to fix it.
std::string RequeueSlurmJob(const std::string& job_id);

}  // namespace ztrain::launcher
