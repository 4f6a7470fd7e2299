#pragma once
// OpQueue: the worker thread behind one MPI communicator (MPI backend only; includes mpi.h).
//
// Owns the MPI_Comm and one thread. Submit() (from the communicator's user thread) queues an
// op; the worker starts ops in issue order with nonblocking MPI calls and polls them with
// MPI_Test, so they progress while the user computes. An op starts once every earlier op
// has finished, except that consecutive point-to-point ops may be in flight together (an
// exchange where both peers send first must not deadlock). Works finish in issue order.
// Every MPI call on the communicator happens on the worker, after its creation. The worker
// also answers the other members' liveness probes, idle or busy (Note [Liveness probe]),
// and parks for good when the process is about to abort (Note [Stopping the workers] in
// mpi_communicator.h).
//
// Failure: the first failed or timed-out op makes the queue failed; queued ops that have not
// started then fail with the same message, and later Submits return a failed Work at once,
// as does Wait() on an op still unfinished. A timed-out op's error names the members that
// no longer answer. Ops already started
// cannot be cancelled (MPI has no cancel for collectives): the worker keeps polling them,
// and Shutdown() abandons the worker if they do not finish (Note [MPI lifetime] in
// mpi_communicator.h).
//
// Note [Liveness probe]: a timeout alone cannot tell the rank that stopped from the ranks
// that waited for it: every rank blocked in the collective times out alike. So before the
// waiting thread reports a timeout it asks its worker to ping every other member on a
// private duplicate of the communicator (the probe comm: pings never match user messages)
// and to wait for the answers for a grace of min(5 s, timeout). Every member's worker
// answers pings: while it polls in-flight ops (an MPI_Improbe at most every 2 ms) and while
// idle (it wakes every 50 ms instead of sleeping until the next op), so a rank that is
// computing, or blocked in the same collective, or probing too, answers at once. A
// SIGSTOPped, hung or killed process answers nothing. The error then names the silent
// members by world rank and host (exchanged when the communicator is created), e.g.
//   rank 1 waited 3.00s for AllReduce of 199936 bytes on world of 4 (timeout 3000 ms):
//   rank 0 (host node7) does not answer: it is stopped, hung or too slow; ranks 2 and 3
//   answered (liveness probe, 3.0 s).
// When every member answers, the error says that none is stopped: the ops were issued in a
// different order, or a member is busy elsewhere (waiting on another communicator, whose
// own timeout will name its silent member). The probe runs once per queue (the first
// timeout's result is kept for later ones: a late answer must not count for a second
// probe); a worker stuck inside a blocking MPI call cannot run it, and the error then says
// so. The stopped rank itself may run again: mpirun sends SIGCONT before SIGTERM to end the
// job, while some ranks are still probing. A worker therefore notes a gap of 1 s or more
// between two rounds of its loop as a stall of its process (MpiRuntime::NoteStall); for 5 s
// after one it takes pings without answering them (they come from probes that began while
// it did not run), and a timeout of its own soon after blames the stall ("this rank itself
// did not run for 6.0 s ...") instead of probing ranks that are by then gone. On the normal
// path the cost is a clock read per poll and an MPI_Improbe every 2 ms while busy, every
// 50 ms while idle; no extra thread.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/communicator.h"
#include "parallel/comm/mpi/liveness.h"
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
  // Why the queue failed; empty while it has not.
  std::string FailureMessage();
  // The oldest op the worker has started and not finished (null when idle).
  std::shared_ptr<OpWork> Oldest();
  MpiRuntime& runtime() const { return *runtime_; }
  // Why an op with `timeout`, waited for since `since`, timed out: from a stall of this
  // process or a liveness probe of the other members (Note [Liveness probe]); blocks for at
  // most min(5 s, timeout) and a margin. Called by a waiting thread.
  std::string WhyTimedOut(std::chrono::milliseconds timeout,
                          std::chrono::steady_clock::time_point since);
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

  enum class ProbeState { kNone, kRunning, kDone };
  using Clock = std::chrono::steady_clock;

  OpQueue(std::shared_ptr<MpiRuntime> runtime, CommInfo info, MemoryTracker* tracker);
  void Run();
  // Pops the next queued op if it may start beside `inflight`; false when none may.
  bool TakeStartable(const std::deque<Pending>& inflight, Pending* out);
  void StartOp(Pending& p);
  void PollOp(Pending& p);
  // Finishes the works of the finished ops at the front of `inflight`, in issue order.
  void RetireFinished(std::deque<Pending>& inflight);
  // Blocks until there is an op or a probe to start, or for kIdleWake so that probes get
  // answered; false once Shutdown() asked the worker to exit and nothing is queued.
  bool WaitForWork();
  // Worker: answers the other members' probes and drives this rank's own.
  void ServeProbes();
  // Worker: notes a gap since the last round that shows this process did not run.
  void NoteStall(Clock::time_point now);
  void StartProbe();
  void PublishLiveness(Liveness liveness);
  // Waiting thread: has the worker probe the other members and waits for the result.
  Liveness ProbeLiveness(std::chrono::milliseconds grace);
  bool ProbeWanted() const {  // worker only
    return probe_state_ == ProbeState::kNone && probe_wanted_.load(std::memory_order_acquire);
  }

  // Declared first so that it is destroyed last: the comms are freed before MPI is finalised.
  std::shared_ptr<MpiRuntime> runtime_;
  MpiComm comm_;
  MpiComm ring_comm_;
  MpiComm probe_comm_;
  std::vector<int> world_ranks_;    // of each member, for messages
  std::vector<std::string> hosts_;  // of each member, for messages
  Scratch scratch_;
  WorkerContext ctx_;  // the worker's only
  // The worker's (Note [Liveness probe]); after probe_comm_, so destroyed before it is freed.
  LivenessProbe probe_;
  ProbeState probe_state_ = ProbeState::kNone;
  Clock::time_point next_answer_{};
  Clock::time_point last_serve_{};  // the previous ServeProbes()
  Clock::time_point mute_until_{};  // pings are dropped, not answered, until then
  Clock::time_point probe_started_{};
  Clock::time_point probe_deadline_{};
  bool probe_broken_ = false;  // an MPI error on probe_comm_: no more answers
  std::thread worker_;

  std::mutex mu_;
  std::condition_variable cv_;  // queue_, stop_ or probe_wanted_ changed; exited_ set
  std::deque<Pending> queue_;
  std::atomic<size_t> queued_{0};  // queue_.size(), for the idle worker's spin
  bool stop_ = false;
  bool exited_ = false;
  int inflight_ = 0;                          // ops the worker has started and not yet finished
  std::shared_ptr<OpWork> oldest_;            // the first of them
  std::exception_ptr failure_;                // set once; what later Submits report
  std::atomic<bool> probe_wanted_{false};     // a waiting thread asked for a probe
  std::chrono::milliseconds probe_grace_{0};  // its grace, set before probe_wanted_
  std::optional<Liveness> liveness_;          // the probe's result, once there is one
  std::condition_variable probe_cv_;          // liveness_ set
};

}  // namespace ztrain::comm::detail
