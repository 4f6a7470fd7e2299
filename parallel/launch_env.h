#pragma once
// Which launcher started this process, and where the process sits in the job
// (DESIGN.md "Communication"; the local rank picks the GPU).
//
// Read from the variables the launchers set, first match wins:
//   mpirun (OpenMPI)  OMPI_COMM_WORLD_SIZE, _RANK, _LOCAL_RANK, _LOCAL_SIZE
//   srun (SLURM)      SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID, and the local size from
//                     SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE) at SLURM_NODEID
//   torchrun          WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE
// Without any of them the process is a world of one (launcher "none"). A launcher is
// recognised by its size variable; its rank variable is then required, and the local ones
// default to a single node. Pure functions; throw ztrain::Error naming the variable when a
// value is not a number or is out of range (rank >= size, local rank >= local size, ...).
// Inside an sbatch script without srun, SLURM_NTASKS describes the allocation rather than
// this process: the launcher checks world_size against the world communicator's size.
#include <functional>
#include <string>

namespace ztrain {

struct LaunchEnv {
  int world_size = 1;
  int rank = 0;
  int local_rank = 0;
  int local_size = 1;
  std::string launcher = "none";  // "none", "openmpi", "slurm" or "torchrun"
};

// Looks variables up with `getenv` (returns nullptr when unset).
LaunchEnv DetectLaunchEnv(const std::function<const char*(const char*)>& getenv);
// Reads the process environment.
LaunchEnv DetectLaunchEnv();

}  // namespace ztrain
