#pragma once
// The NCCL communicator for device memory (DESIGN.md "Communication"). This header includes
// neither cuda_runtime.h nor nccl.h; it compiles whether or not the build has NCCL.
//
// One communicator owns one non-blocking NCCL communicator, one CUDA stream and a few bytes
// of device scratch (counted as kCommunication by the tracker). Ops are enqueued on the
// stream in issue order and each records a CUDA event; Work::Done() queries the event and
// NCCL's asynchronous error, Work::Wait() polls them until the op finishes, NCCL reports an
// error, or the timeout passes (Note [NCCL timeouts] in nccl_queue.h).
//
// Memory contract: tensors must be device memory of the communicator's device (Device
// cuda:N and a cudaMalloc'd pointer; anything else throws ztrain::Error from the issuing
// call). An op reads its input after all work issued before it on the legacy default stream;
// work on other streams must be synchronised by the caller before the op is issued. Once
// Wait() returns (or Done() is true) the output may be used from any stream.
//
// Send and Recv: NCCL has no tags, so messages between two ranks match in issue order; the
// tag only names the op in errors. Consecutive Send/Recv ops are launched together as one
// NCCL group (Note [NCCL p2p groups] in nccl_queue.h); a size mismatch between a Send and its
// Recv is not detected and ends as a timeout.
//
// Failure: an NCCL error or a timeout aborts the NCCL communicator (ncclCommAbort, which
// stops its kernels); every later op then fails at once with CommError and Split throws.
// The communicator's world ranks are the ranks of the bootstrap communicator it was made
// over; a Split's name lists them.
#include <chrono>
#include <memory>

#include "core/memory_tracker.h"
#include "parallel/comm/communicator.h"

namespace ztrain::comm {

// Collective over `bootstrap` (any Communicator of host memory, usually the MPI world; only
// its rank, size and one Broadcast are used): rank 0 creates the NCCL id and broadcasts it,
// then every rank makes `device` current and joins the NCCL communicator. Initialisation is
// bounded by `timeout`, which later ops inherit. Throws ztrain::Error when this build has no
// NCCL or `device` is not a visible CUDA device, CommError when NCCL cannot be initialised or
// a rank does not join in time. The scratch memory is counted by `tracker` (may be null;
// must then outlive the communicator and its splits).
std::unique_ptr<Communicator> MakeNcclCommunicator(Communicator& bootstrap, int device,
                                                   std::chrono::milliseconds timeout,
                                                   MemoryTracker* tracker = nullptr);

// Whether this build has the NCCL communicator and libnccl opens (Note [Lazy GPU libraries]
// in core/lazy_library.h: it is opened by the first call of this or of MakeNcclCommunicator).
bool HaveNccl();

// CUDA devices this process can use: 0 when the build has no NCCL, or there is no driver or
// no GPU. Never throws.
int VisibleCudaDevices();

}  // namespace ztrain::comm
