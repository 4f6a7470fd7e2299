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
// Note [Stopping the workers]: the shutdown order. No worker thread may be inside MPI when
// the process tears MPI down: MPI_Abort ends in exit(), which unmaps the shared-memory
// segments a worker polling MPI_Test/MPI_Testall reads (stopping rank 0 of 4 made a waiting
// rank segfault that way in 7 runs of 17). So AbortWorld first sets the runtime's
// stopping flag; every worker checks it before each round of MPI calls and parks for good
// (an idle worker wakes within 50 ms to see it), and AbortWorld waits until all have parked,
// at most 2 s (a worker blocked inside a blocking MPI call cannot), before MPI_Abort.
// Unwinding comes before AbortWorld, though, and it frees buffers that ops MPI cannot
// cancel still use (a gradient bucket of the stalled all-reduce): a worker that went on
// polling would let MPI read freed memory (a waiting rank segfaulted that way, inside
// MPI_Improbe, once the first fix was in). So under OnCommFailure::kStopProcess, the
// launcher's choice, the Wait() that is about to throw stops the workers the same way first,
// after the liveness probe, and every later Wait or Shutdown returns at once.
// MPI_Finalize needs no such step: it runs when the last holder of the runtime lets go, and
// every worker thread holds the runtime until after its last MPI call, so none is left.
// Under kFailCommunicator a timed-out op is left polling (it cannot be cancelled) and its
// liveness probe answered until then (Note [Liveness probe] in op_queue.h).
#include <chrono>
#include <memory>

#include "core/memory_tracker.h"
#include "parallel/comm/communicator.h"

namespace ztrain::comm {

// What a failed or timed-out op does to the rest of the process's MPI work.
enum class OnCommFailure {
  // Only its communicator fails; the others go on, and ops it had started are still polled,
  // so a late peer can complete them (their buffers must then stay valid). For programs
  // that recover, and for tests.
  kFailCommunicator,
  // Before Wait() throws, every worker of the process stops calling MPI for good, so that
  // the caller may free the buffers of ops MPI still holds while it unwinds to AbortWorld
  // (Note [Stopping the workers]). Later Waits on this process's ops throw at once. For a
  // program that ends the job on any failure, as the launcher does.
  kStopProcess,
};

// Throws Error when this build has no MPI, MPI cannot be initialised, it lacks thread
// support, or MPI was already finalised in this process. Scratch memory of the world and
// its splits (the ring algorithms' chunks) is counted as kCommunication by `tracker`, which
// must then outlive them. `on_failure` applies to the world and its splits.
std::unique_ptr<Communicator> MakeMpiWorld(
    std::chrono::milliseconds timeout, MemoryTracker* tracker = nullptr,
    OnCommFailure on_failure = OnCommFailure::kFailCommunicator);

// Whether this build has the MPI communicator.
bool HaveMpi();

// Ends every rank of the job with exit code `code` (MPI_Abort on MPI_COMM_WORLD, or _Exit
// when MPI is not running), after the communicators' worker threads have stopped calling MPI
// (Note [Stopping the workers]). For launcher/ only, after it has logged the error: library
// code throws instead.
[[noreturn]] void AbortWorld(int code);

}  // namespace ztrain::comm
