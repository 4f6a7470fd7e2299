#include "parallel/comm/nccl/nccl_queue.h"

#include <cstdio>

#include "parallel/comm/comm_util.h"

namespace ztrain::comm::detail {
namespace {

using std::chrono::steady_clock;

std::string Seconds(steady_clock::duration d) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2fs", std::chrono::duration<double>(d).count());
  return s;
}

// "ready" when an event has completed; clears the not-ready status CUDA may keep as the
// last error, so it is not reported by an unrelated call later.
cudaError_t QueryEvent(const CudaEvent& event) {
  const cudaError_t rc = cudaEventQuery(event.get());
  if (rc != cudaSuccess) (void)cudaGetLastError();
  return rc;
}

// The Work of an op that was never launched: Wait() throws `error`.
WorkPtr Refused(const CommError& error) { return FinishedWork(std::make_exception_ptr(error)); }

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclQueue> queue, std::shared_ptr<NcclLaunch> launch, NcclOpLabel label,
           std::chrono::milliseconds timeout)
      : queue_(std::move(queue)),
        launch_(std::move(launch)),
        label_(std::move(label)),
        timeout_(timeout) {}
  void Wait() override { queue_->Wait(*launch_, label_, timeout_); }
  bool Done() override { return queue_->Done(*launch_); }

 private:
  std::shared_ptr<NcclQueue> queue_;
  std::shared_ptr<NcclLaunch> launch_;
  NcclOpLabel label_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::string NcclOpLabel::ToString() const {
  std::string s = op;
  if (numel >= 0) {
    s += StrCat(" of ", numel, " ", DTypeName(dtype), " elements (",
                numel * static_cast<int64_t>(DTypeSize(dtype)), " bytes)");
  }
  return s + detail + " on " + (group ? *group : std::string("?"));
}

std::shared_ptr<NcclQueue> NcclQueue::Create(ncclComm_t comm, int device, int world_rank,
                                             size_t scratch_bytes, MemoryTracker* tracker,
                                             std::chrono::milliseconds timeout) {
  try {
    DeviceGuard guard(device);
    return std::shared_ptr<NcclQueue>(
        new NcclQueue(comm, device, world_rank, scratch_bytes, tracker, timeout));
  } catch (...) {
    (void)ncclCommAbort(comm);  // the queue would have owned it
    throw;
  }
}

NcclQueue::NcclQueue(ncclComm_t comm, int device, int world_rank, size_t scratch_bytes,
                     MemoryTracker* tracker, std::chrono::milliseconds timeout)
    : scratch_(scratch_bytes, tracker),
      staging_(scratch_bytes),
      device_(device),
      world_rank_(world_rank),
      tracker_(tracker),
      comm_(comm),
      timeout_(timeout) {}

NcclQueue::~NcclQueue() { Close(); }

std::chrono::milliseconds NcclQueue::timeout() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timeout_;
}

void NcclQueue::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  timeout_ = timeout;
}

WorkPtr NcclQueue::Collective(NcclOpLabel label, const LaunchFn& launch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (comm_ == nullptr) return Refused(FailedError(label, "was not run"));
  try {
    DeviceGuard guard(device_);
    if (!FlushP2p()) return Refused(FailedError(label, "was not run"));
    auto l = std::make_shared<NcclLaunch>(label);
    FollowDefaultStream();
    if (!Enqueued(l, launch(comm_, stream_.get()))) {
      return Refused(CommError(failure_));
    }
    return std::make_shared<NcclWork>(shared_from_this(), std::move(l), std::move(label), timeout_);
  } catch (const std::exception& e) {
    Fail(
        StrCat("rank ", world_rank_, ": ", label.ToString(), " could not be launched: ", e.what()));
    return Refused(CommError(failure_));
  }
}

WorkPtr NcclQueue::P2p(NcclOpLabel label, const P2pOp& op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (comm_ == nullptr) return Refused(FailedError(label, "was not run"));
  try {
    if (!held_launch_) {
      DeviceGuard guard(device_);  // the launch's event belongs to the device
      held_launch_ = std::make_shared<NcclLaunch>(label);
    }
  } catch (const std::exception& e) {
    Fail(StrCat("rank ", world_rank_, ": ", label.ToString(), " could not be queued: ", e.what()));
    return Refused(CommError(failure_));
  }
  held_ops_.push_back(op);
  return std::make_shared<NcclWork>(shared_from_this(), held_launch_, std::move(label), timeout_);
}

bool NcclQueue::FlushP2p() {  // Note [NCCL p2p groups]
  if (held_ops_.empty()) return true;
  std::shared_ptr<NcclLaunch> launch = std::move(held_launch_);
  std::vector<P2pOp> ops = std::move(held_ops_);
  held_launch_.reset();
  held_ops_.clear();
  try {
    FollowDefaultStream();
  } catch (const std::exception& e) {
    Fail(StrCat("rank ", world_rank_, ": ", launch->first.ToString(),
                " could not be launched: ", e.what()));
    return false;
  }
  ncclResult_t rc = ncclGroupStart();
  if (rc == ncclSuccess) {
    for (const P2pOp& op : ops) {
      rc = op.send ? ncclSend(op.data, op.nbytes, ncclUint8, op.peer, comm_, stream_.get())
                   : ncclRecv(op.data, op.nbytes, ncclUint8, op.peer, comm_, stream_.get());
      if (rc != ncclSuccess && rc != ncclInProgress) break;
    }
    const ncclResult_t end = ncclGroupEnd();  // closes the group even after an error
    if (rc == ncclSuccess || rc == ncclInProgress) rc = end;
  }
  return Enqueued(launch, rc);
}

void NcclQueue::FollowDefaultStream() {
  ZTRAIN_CUDA_CHECK(cudaEventRecord(default_stream_done_.get(), cudaStreamLegacy));
  ZTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), default_stream_done_.get(), 0));
}

bool NcclQueue::Enqueued(const std::shared_ptr<NcclLaunch>& launch, ncclResult_t rc) {
  const auto start = steady_clock::now();
  // Note [NCCL timeouts]: the kernels are on the stream only once NCCL leaves ncclInProgress;
  // an event recorded earlier would complete before the op.
  if (rc == ncclInProgress) rc = AwaitComms({comm_}, start + timeout_);
  if (rc == ncclInProgress) {
    Fail(StrCat("rank ", world_rank_, " waited ", Seconds(steady_clock::now() - start),
                " for NCCL to launch ", launch->first.ToString(), " (timeout ", timeout_.count(),
                " ms): the first op between two ranks connects them, so another rank has failed, "
                "stopped, or issued ops on this communicator in a different order"));
    return false;
  }
  if (rc != ncclSuccess) {
    Fail(StrCat("rank ", world_rank_, ": NCCL could not launch ", launch->first.ToString(), ": ",
                NcclErrorString(rc, comm_)));
    return false;
  }
  const cudaError_t recorded = cudaEventRecord(launch->done.get(), stream_.get());
  if (recorded != cudaSuccess) {
    (void)cudaGetLastError();
    Fail(StrCat("rank ", world_rank_, ": cudaEventRecord after ", launch->first.ToString(),
                " failed: ", CudaErrorString(recorded)));
    return false;
  }
  launch->launched = true;
  // Forget launches that have finished, oldest first, so the list stays short.
  while (!inflight_.empty() &&
         (inflight_.front()->finished || QueryEvent(inflight_.front()->done) == cudaSuccess)) {
    inflight_.front()->finished = true;
    inflight_.pop_front();
  }
  inflight_.push_back(launch);
  return true;
}

bool NcclQueue::PollLocked(NcclLaunch& launch) {
  if (launch.finished) return true;
  if (comm_ == nullptr) return true;  // failed or closed: the caller reports it
  if (!launch.launched && !FlushP2p()) return true;
  const cudaError_t rc = QueryEvent(launch.done);
  if (rc == cudaSuccess) {
    launch.finished = true;
    return true;
  }
  if (rc != cudaErrorNotReady) {
    Fail(StrCat("rank ", world_rank_, ": ", launch.first.ToString(),
                " failed on the device: ", CudaErrorString(rc)));
    return true;
  }
  ncclResult_t state = ncclSuccess;
  const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
  if (queried != ncclSuccess) state = queried;
  if (state != ncclSuccess && state != ncclInProgress) {
    Fail(StrCat("rank ", world_rank_, ": NCCL reported an error while ", launch.first.ToString(),
                " was running: ", NcclErrorString(state, comm_)));
    return true;
  }
  return false;
}

bool NcclQueue::Done(NcclLaunch& launch) {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    DeviceGuard guard(device_);
    return PollLocked(launch);
  } catch (const std::exception& e) {
    Fail(
        StrCat("rank ", world_rank_, ": polling ", launch.first.ToString(), " failed: ", e.what()));
    return true;
  }
}

void NcclQueue::Wait(NcclLaunch& launch, const NcclOpLabel& label,
                     std::chrono::milliseconds timeout) {
  const auto start = steady_clock::now();
  Backoff backoff;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const bool was_healthy = failure_.empty();
      bool done = true;
      try {
        DeviceGuard guard(device_);
        done = PollLocked(launch);
      } catch (const std::exception& e) {
        Fail(StrCat("rank ", world_rank_, ": waiting for ", label.ToString(),
                    " failed: ", e.what()));
      }
      if (launch.finished) return;
      if (done && was_healthy && !failure_.empty()) throw CommError(failure_);  // found it now
      if (done) throw FailedError(label, "did not finish");
      const auto waited = steady_clock::now() - start;
      if (waited >= timeout) {  // Note [NCCL timeouts]
        const std::string reason =
            StrCat("rank ", world_rank_, " waited ", Seconds(waited), " for ", label.ToString(),
                   " (timeout ", timeout.count(),
                   " ms): another rank has failed, stopped, or issued ops on this communicator "
                   "in a different order.",
                   OldestUnfinished(launch),
                   " The NCCL communicator was aborted and cannot be used again.");
        Fail(reason);
        throw CommError(reason);
      }
    }
    backoff.Pause();
  }
}

std::string NcclQueue::OldestUnfinished(const NcclLaunch& self) {
  for (const auto& l : inflight_) {
    if (l->finished) continue;
    if (QueryEvent(l->done) == cudaSuccess) {
      l->finished = true;
      continue;
    }
    if (l.get() == &self) return "";
    return StrCat(" It was queued behind ", l->first.ToString(), ", which has not finished.");
  }
  return "";
}

void NcclQueue::Fail(const std::string& reason) {
  if (!failure_.empty()) return;
  failure_ = reason;
  // Ops seen complete keep their results; the abort fails everything else.
  for (const auto& l : inflight_) {
    if (!l->finished && QueryEvent(l->done) == cudaSuccess) l->finished = true;
  }
  inflight_.clear();
  held_ops_.clear();
  held_launch_.reset();
  if (comm_ != nullptr) {
    (void)ncclCommAbort(comm_);  // stops the kernels and frees the communicator
    comm_ = nullptr;
  }
}

CommError NcclQueue::FailedError(const NcclOpLabel& label, const char* verb) const {
  if (failure_.empty()) {
    return CommError(StrCat(label.ToString(), " ", verb, ": its communicator was destroyed"));
  }
  return CommError(
      StrCat(label.ToString(), " ", verb, ": this communicator failed earlier: ", failure_));
}

ncclComm_t NcclQueue::SplitComm(int color, int key, const NcclOpLabel& label) {
  std::lock_guard<std::mutex> lock(mu_);
  if (comm_ == nullptr) throw FailedError(label, "was not run");
  DeviceGuard guard(device_);
  if (!FlushP2p()) throw FailedError(label, "was not run");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t child = nullptr;
  const auto start = steady_clock::now();
  ncclResult_t rc = ncclCommSplit(comm_, color, key, &child, &config);
  if (rc == ncclSuccess || rc == ncclInProgress) rc = AwaitComms({comm_, child}, start + timeout_);
  if (rc == ncclSuccess) return child;
  if (child != nullptr) (void)ncclCommAbort(child);
  const std::string reason =
      rc == ncclInProgress
          ? StrCat("rank ", world_rank_, " waited ", Seconds(steady_clock::now() - start), " for ",
                   label.ToString(), " (timeout ", timeout_.count(),
                   " ms): another rank has failed, stopped, or did not call Split")
          : StrCat("rank ", world_rank_, ": ", label.ToString(),
                   " failed: ", NcclErrorString(rc, comm_));
  Fail(reason);
  throw CommError(reason);
}

void NcclQueue::Close() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (comm_ == nullptr) return;  // closed, or aborted: nothing more to do
  try {
    DeviceGuard guard(device_);
    if (!FlushP2p()) return;
    const auto deadline = steady_clock::now() + timeout_;
    Backoff backoff;
    cudaError_t rc;
    while ((rc = cudaStreamQuery(stream_.get())) == cudaErrorNotReady &&
           steady_clock::now() < deadline) {
      (void)cudaGetLastError();
      backoff.Pause();
    }
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      Fail(rc == cudaErrorNotReady
               ? StrCat("rank ", world_rank_, ": ops issued on the communicator had not finished ",
                        timeout_.count(), " ms after it was destroyed")
               : StrCat("rank ", world_rank_,
                        ": the stream failed before the communicator was "
                        "destroyed: ",
                        CudaErrorString(rc)));
      return;
    }
    for (const auto& l : inflight_) l->finished = true;
    inflight_.clear();
    ncclResult_t fin = ncclCommFinalize(comm_);
    if (fin == ncclSuccess || fin == ncclInProgress) fin = AwaitComms({comm_}, deadline);
    if (fin != ncclSuccess) {
      Fail(StrCat("rank ", world_rank_,
                  ": ncclCommFinalize did not finish: ", NcclErrorString(fin, comm_)));
      return;
    }
    (void)ncclCommDestroy(comm_);
    comm_ = nullptr;
  } catch (const std::exception& e) {
    Fail(StrCat("rank ", world_rank_, ": closing the communicator failed: ", e.what()));
  }
}

}  // namespace ztrain::comm::detail
