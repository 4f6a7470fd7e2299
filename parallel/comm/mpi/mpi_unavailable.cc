// The MPI communicator's entry points in a build without MPI.
#include <cstdlib>

#include "core/error.h"
#include "parallel/comm/mpi/mpi_communicator.h"

namespace ztrain::comm {

std::unique_ptr<Communicator> MakeMpiWorld(std::chrono::milliseconds, MemoryTracker*,
                                           OnCommFailure) {
  throw Error("this build has no MPI; reconfigure with -DZTRAIN_WITH_MPI=ON");
}

bool HaveMpi() { return false; }

void AbortWorld(int code) { std::_Exit(code); }

}  // namespace ztrain::comm
