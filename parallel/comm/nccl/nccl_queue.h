#pragma once
// NcclQueue: the NCCL communicator, stream and scratch behind one NcclCommunicator (NCCL
// backend only; includes nccl.h through nccl_runtime.h).
//
// Owns the ncclComm_t (non-blocking), one CUDA stream, the device scratch and a pinned host
// staging buffer. Ops are launched on the stream in issue order; each launch records an
// event that its Works query. All state sits behind one mutex, so Works may be polled from
// any thread; NCCL is only called with the mutex held. The queue is shared by its
// communicator and its Works: a Work outlives its communicator safely, but the NCCL
// communicator itself is finalised when the communicator closes the queue.
//
// Note [NCCL timeouts]: NCCL kernels wait on the GPU for their peers without limit, so the
// host enforces the timeout. Wait() polls the op's event and ncclCommGetAsyncError (Note
// [poll backoff]) and, when NCCL reports an error or the timeout passes, calls
// ncclCommAbort: that stops the kernels, so the stream drains and the device stays usable.
// The queue is then failed for good: ops already launched and not seen finished fail, later
// ops fail at once, and their messages name the first failure. A non-blocking communicator
// may also report an op "in progress" before its kernels are on the stream (the first op
// between two ranks connects them, which needs the peer); the issuing call then polls until
// NCCL has enqueued it, bounded by the same timeout, and a timeout there fails the op the
// same way.
//
// Note [NCCL p2p groups]: NCCL runs the Sends and Recvs of one ncclGroupStart/End together,
// and outside a group a Send blocks the stream until its Recv is posted, so two ranks that
// both send first would deadlock. The queue therefore holds consecutive Send/Recv ops and
// launches them as one group when the next non-p2p op is issued, or when any of their Works
// is waited on or polled, or at Split or close. Until then they are not on the stream at all.
// So issue a whole exchange before waiting on or polling any part of it: a Send polled before
// its rank issues the Recv is launched alone.
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/communicator.h"
#include "parallel/comm/nccl/nccl_runtime.h"

namespace ztrain::comm::detail {

// Names an op in errors, e.g. "Send of 1024 fp32 elements (4096 bytes) to rank 1 (tag 3) on
// world of 2". Kept in parts and formatted only when an error is raised.
struct NcclOpLabel {
  const char* op = "";
  int64_t numel = -1;  // -1: the op has no buffer (Barrier, Split)
  DType dtype = DType::kF32;
  std::string detail;                        // e.g. " to rank 1 (tag 3)"
  std::shared_ptr<const std::string> group;  // the communicator's name()
  std::string ToString() const;
};

// One launch on the stream: a collective, or a group of Send/Recv ops.
struct NcclLaunch {
  explicit NcclLaunch(NcclOpLabel first) : first(std::move(first)) {}
  NcclOpLabel first;  // its (first) op, named when a later op times out behind it
  CudaEvent done;     // recorded after its kernels
  bool launched = false;
  bool finished = false;  // seen complete; an abort after that does not fail it
};

struct P2pOp {
  bool send = false;
  void* data = nullptr;
  size_t nbytes = 0;
  int peer = 0;
};

class NcclQueue : public std::enable_shared_from_this<NcclQueue> {
 public:
  using LaunchFn = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;

  // Takes `comm` (initialised, not in progress). `scratch_bytes` of device memory are
  // counted by `tracker` (may be null). Call with `device` current.
  static std::shared_ptr<NcclQueue> Create(ncclComm_t comm, int device, int world_rank,
                                           size_t scratch_bytes, MemoryTracker* tracker,
                                           std::chrono::milliseconds timeout);
  ~NcclQueue();
  NcclQueue(const NcclQueue&) = delete;
  NcclQueue& operator=(const NcclQueue&) = delete;

  // Launches held p2p ops, then `launch` (which enqueues NCCL calls, and copies if it needs
  // them, on the given stream). A failure returns a failed Work; never throws CommError.
  WorkPtr Collective(NcclOpLabel label, const LaunchFn& launch);
  // Holds a Send or Recv for the next group (Note [NCCL p2p groups]).
  WorkPtr P2p(NcclOpLabel label, const P2pOp& op);
  // ncclCommSplit, once earlier ops are launched; throws CommError (and fails this queue)
  // when NCCL fails or the split does not finish within the timeout.
  ncclComm_t SplitComm(int color, int key, const NcclOpLabel& label);

  int device() const { return device_; }
  int world_rank() const { return world_rank_; }
  MemoryTracker* tracker() const { return tracker_; }
  void* scratch() const { return scratch_.get(); }  // device, scratch_bytes
  void* staging() const { return staging_.get(); }  // pinned host, scratch_bytes
  std::chrono::milliseconds timeout() const;
  void set_timeout(std::chrono::milliseconds timeout);

  // For Works: Done() and Wait() of an op in `launch` named by `label`.
  bool Done(NcclLaunch& launch);
  void Wait(NcclLaunch& launch, const NcclOpLabel& label, std::chrono::milliseconds timeout);

  // Launches held p2p ops and waits up to the timeout for the stream, then finalises and
  // destroys the NCCL communicator, or aborts it when something failed or did not finish.
  // Later ops fail. Never throws.
  void Close() noexcept;

 private:
  NcclQueue(ncclComm_t comm, int device, int world_rank, size_t scratch_bytes,
            MemoryTracker* tracker, std::chrono::milliseconds timeout);

  // All below: with mu_ held and device_ current.
  // Launches the held p2p group; false (and the queue failed) when that fails.
  bool FlushP2p();
  // After the NCCL calls of `launch` returned `rc`: waits out ncclInProgress, records the
  // event; false (and the queue failed) when NCCL failed or the timeout passed.
  bool Enqueued(const std::shared_ptr<NcclLaunch>& launch, ncclResult_t rc);
  // Makes the stream wait for work issued so far on the legacy default stream.
  void FollowDefaultStream();
  // True once `launch` has finished or never can (the queue failed; the caller says which).
  // Launches it first if it is the held p2p group; fails the queue on an NCCL or CUDA error.
  bool PollLocked(NcclLaunch& launch);
  // Marks launches that have finished, then aborts the NCCL communicator; `reason` names
  // the first failure in every later message.
  void Fail(const std::string& reason);
  // "<op> <verb>: this communicator failed earlier: <first failure>".
  CommError FailedError(const NcclOpLabel& label, const char* verb) const;
  // " It was queued behind <op>, which has not finished." when an older launch than `self`
  // is still running, else "".
  std::string OldestUnfinished(const NcclLaunch& self);

  // Declared first, destroyed last: the stream outlives the events recorded on it.
  CudaStream stream_;
  CudaEvent default_stream_done_;
  DeviceBuffer scratch_;
  PinnedBuffer staging_;
  int device_;
  int world_rank_;
  MemoryTracker* tracker_;

  mutable std::mutex mu_;
  ncclComm_t comm_;  // null once destroyed (Close) or aborted (Fail)
  std::chrono::milliseconds timeout_;
  std::deque<std::shared_ptr<NcclLaunch>> inflight_;  // launched, oldest first
  std::shared_ptr<NcclLaunch> held_launch_;           // Note [NCCL p2p groups]
  std::vector<P2pOp> held_ops_;
  std::string failure_;  // set once: why the queue failed
};

}  // namespace ztrain::comm::detail
