#pragma once
// Which launcher started this process, and where the process sits in the job
// (DESIGN.md "Communication"; the local rank picks the GPU).
//
// Read from the variables the launchers set, first match wins:
//   mpirun (OpenMPI)  OMPI_COMM_WORLD_SIZE, _RANK, _LOCAL_RANK, _LOCAL_SIZE
//   srun (SLURM)      SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID, and the local size from
//                     SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE) at SLURM_NODEID,
//                     in a task of a job step only (SLURM_STEP_ID set)
//   torchrun          WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE
// Without any of them the process is a world of one (launcher "none"). A launcher is
// recognised by its size variable; its rank variable is then required, and the local ones
// default to a single node. Pure functions; throw ztrain::Error naming the variable when a
// value is not a number or is out of range (rank >= size, local rank >= local size, ...).
// Inside an sbatch script without srun, SLURM_NTASKS describes the allocation rather than
// this process, and there is no SLURM_STEP_ID: the process is a world of one (or what
// torchrun's variables say). The launcher checks world_size against MPI's world size.
// Whatever the launcher, a process inside a SLURM job also reads the job's id, how often it
// was requeued (SLURM_RESTART_COUNT), SLURM_CPUS_PER_TASK and SLURM_GPUS_PER_TASK, and every
// process knows its host name (log lines of ranks other than 0 carry it).
#include <functional>
#include <string>

namespace ztrain {

struct LaunchEnv {
  int world_size = 1;
  int rank = 0;
  int local_rank = 0;
  int local_size = 1;
  std::string launcher = "none";  // "none", "openmpi", "slurm" or "torchrun"
  std::string host;               // this machine's short host name ("" when unknown)
  std::string slurm_job_id;       // SLURM_JOB_ID; "" outside a SLURM job
  int slurm_restart_count = 0;    // SLURM_RESTART_COUNT: times the job was requeued
  int cpus_per_task = 0;          // SLURM_CPUS_PER_TASK; 0 when not set
  int gpus_per_task = 0;          // SLURM_GPUS_PER_TASK; 0 when not set
};

// Looks variables up with `getenv` (returns nullptr when unset).
LaunchEnv DetectLaunchEnv(const std::function<const char*(const char*)>& getenv);
// Reads the process environment.
LaunchEnv DetectLaunchEnv();

}  // namespace ztrain
