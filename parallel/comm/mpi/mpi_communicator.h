#pragma once
// The MPI communicator for host memory (DESIGN.md "Communication"). This header does not
// include mpi.h; it compiles whether or not the build has MPI.
//
// MakeMpiWorld initialises MPI (MPI_THREAD_MULTIPLE) unless the host program already has,
// and returns a communicator over a duplicate of MPI_COMM_WORLD, so ztrain's messages never
// match the program's own. Each communicator (the world and every Split) owns one worker
// thread that starts its ops in issue order with nonblocking MPI calls and polls them with
// MPI_Test, so collectives progress while the caller computes; Work::Wait() waits for the
// worker and throws CommError when the op fails or takes longer than the timeout.
// Note [MPI lifetime]: MPI is finalised when the last communicator of the process is
// destroyed (the world and its splits share one runtime), and only when ztrain initialised
// it. A communicator whose op failed or timed out cannot cancel collectives already started:
// its destructor abandons them (the worker thread is detached) and MPI is then never
// finalised, so the launcher must end the job with AbortWorld.
#include <chrono>
#include <memory>

#include "core/memory_tracker.h"
#include "parallel/comm/communicator.h"

namespace ztrain::comm {

// Throws Error when this build has no MPI, MPI cannot be initialised, it lacks thread
// support, or MPI was already finalised in this process. Scratch memory of the world and
// its splits (the ring algorithms' chunks) is counted as kCommunication by `tracker`, which
// must then outlive them.
std::unique_ptr<Communicator> MakeMpiWorld(std::chrono::milliseconds timeout,
                                           MemoryTracker* tracker = nullptr);

// Whether this build has the MPI communicator.
bool HaveMpi();

// Ends every rank of the job with exit code `code` (MPI_Abort on MPI_COMM_WORLD, or _Exit
// when MPI is not running). For launcher/ only, after it has logged the error: library code
// throws instead.
[[noreturn]] void AbortWorld(int code);

}  // namespace ztrain::comm
