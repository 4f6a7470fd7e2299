#pragma once
// For benchmarks run under mpirun: the ranks on one node share its cores unless
// OMP_NUM_THREADS says otherwise, as the ztrain launcher arranges (launcher/commands.cc).
// OpenBLAS (OpenMP build) follows the OpenMP thread count. Returns the rank's thread count.
#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "parallel/launch_env.h"

namespace ztrain::bench {

inline int ShareCoresAmongLocalRanks() {
  const LaunchEnv env = DetectLaunchEnv();
  if (std::getenv("OMP_NUM_THREADS") == nullptr && env.local_size > 1) {
    omp_set_num_threads(std::max(1, omp_get_num_procs() / env.local_size));
  }
  return omp_get_max_threads();
}

}  // namespace ztrain::bench
