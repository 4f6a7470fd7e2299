#pragma once
// OpQueue: the worker thread behind one MPI communicator (MPI backend only; includes mpi.h).
//
// Owns the MPI_Comm and one thread. Submit() (from the communicator's user thread) queues an
// op; the worker starts ops in issue order with nonblocking MPI calls and polls them with
// MPI_Test, so they progress while the user computes. An op starts once every earlier op
// has finished, except that consecutive point-to-point ops may be in flight together (an
// exchange where both peers send first must not deadlock). Works finish in issue order.
// Every MPI call on the communicator happens on the worker, after its creation.
//
// Failure: the first failed or timed-out op makes the queue failed; queued ops that have not
// started then fail with the same message, and later Submits return a failed Work at once.
// Ops already started cannot be cancelled (MPI has no cancel for collectives): the worker
// keeps polling them, and Shutdown() abandons the worker if they do not finish
// (Note [MPI lifetime] in mpi_communicator.h).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "parallel/comm/communicator.h"
#include "parallel/comm/mpi/mpi_runtime.h"
#include "parallel/comm/mpi/mpi_task.h"

namespace ztrain::comm::detail {

class OpWork;

// Names an op in errors, e.g. "Send of 4096 bytes to rank 1 (tag 3) on world of 2". Kept in
// parts and formatted only when an error is raised: issuing an op must stay cheap.
struct OpLabel {
  const char* op = "";
  int64_t nbytes = -1;                       // -1: the op has no size
  std::string detail;                        // e.g. " to rank 1 (tag 3)"
  std::shared_ptr<const std::string> group;  // the communicator's name()
  std::string ToString() const;
};

class OpQueue : public std::enable_shared_from_this<OpQueue> {
 public:
  // Starts the worker thread for `info`'s communicators. Scratch memory is counted by
  // `tracker` (may be null; must outlive the queue).
  static std::shared_ptr<OpQueue> Start(std::shared_ptr<MpiRuntime> runtime, CommInfo info,
                                        MemoryTracker* tracker);
  ~OpQueue();

  // Queues `task`; `p2p` marks a Send/Recv. `label` names it in errors and `timeout` bounds
  // its Wait().
  WorkPtr Submit(std::unique_ptr<MpiTask> task, bool p2p, OpLabel label,
                 std::chrono::milliseconds timeout);
  // Marks the queue failed with `error` (the first failure wins) and fails queued ops.
  void Fail(std::exception_ptr error);
  int world_rank() const { return runtime_->world_rank(); }
  // The oldest op the worker has started and not finished (null when idle).
  std::shared_ptr<OpWork> Oldest();
  MpiRuntime& runtime() const { return *runtime_; }
  // Lets the worker finish what was issued and joins it. If it has not finished after
  // `grace` (no wait at all once the queue has failed), abandons it.
  void Shutdown(std::chrono::milliseconds grace);

 private:
  struct Pending {
    std::unique_ptr<MpiTask> task;
    bool p2p = false;
    std::shared_ptr<OpWork> work;
    bool finished = false;
    std::exception_ptr error;
  };

  OpQueue(std::shared_ptr<MpiRuntime> runtime, CommInfo info, MemoryTracker* tracker);
  void Run();
  // Pops the next queued op if it may start beside `inflight`; false when none may.
  bool TakeStartable(const std::deque<Pending>& inflight, Pending* out);
  void StartOp(Pending& p);
  void PollOp(Pending& p);

  // Declared first so that it is destroyed last: the comms are freed before MPI is finalised.
  std::shared_ptr<MpiRuntime> runtime_;
  MpiComm comm_;
  MpiComm ring_comm_;
  Scratch scratch_;
  WorkerContext ctx_;  // the worker's only
  std::thread worker_;

  std::mutex mu_;
  std::condition_variable cv_;  // queue_ or stop_ changed; exited_ set
  std::deque<Pending> queue_;
  std::atomic<size_t> queued_{0};  // queue_.size(), for the idle worker's spin
  bool stop_ = false;
  bool exited_ = false;
  int inflight_ = 0;                // ops the worker has started and not yet finished
  std::shared_ptr<OpWork> oldest_;  // the first of them
  std::exception_ptr failure_;      // set once; what later Submits report
};

}  // namespace ztrain::comm::detail
