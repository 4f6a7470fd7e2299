// The NCCL communicator's entry points in a build without NCCL.
#include "core/error.h"
#include "parallel/comm/nccl/nccl_communicator.h"

namespace ztrain::comm {

std::unique_ptr<Communicator> MakeNcclCommunicator(Communicator&, int, std::chrono::milliseconds,
                                                   MemoryTracker*) {
  throw Error(
      "this ztrain was built without NCCL; rebuild with -DZTRAIN_WITH_NCCL=ON (needs the CUDA "
      "toolkit and NCCL), or use the MPI communicator");
}

bool HaveNccl() { return false; }

// Without NCCL this build cannot use a GPU for communication, so it reports none.
int VisibleCudaDevices() { return 0; }

}  // namespace ztrain::comm
