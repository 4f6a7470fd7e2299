#include "parallel/comm/mpi/op_queue.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "parallel/comm/comm_util.h"

namespace ztrain::comm::detail {

// Note [spin then block]: how long a waiting thread, and the idle worker, poll (yielding
// the core) before they block on a condition variable. A futex wake-up costs tens of
// microseconds in a VM, a fifth of a 1 MiB all-reduce; a caller in Wait() has nothing else
// to do, and the next op usually follows the last one at once.
constexpr std::chrono::microseconds kWaitSpin(1000);
constexpr std::chrono::microseconds kIdleSpin(50);

// Note [Liveness probe]: how often a busy worker looks for pings, how long an idle one
// sleeps between looks, the longest a probe waits for answers, and how much longer the
// waiting thread gives the worker to report.
constexpr std::chrono::milliseconds kAnswerEvery(2);
constexpr std::chrono::milliseconds kIdleWake(50);
constexpr std::chrono::milliseconds kMaxProbeGrace(5000);
constexpr std::chrono::milliseconds kProbeMargin(1000);
// A gap this long between two rounds of the worker's loop (which come every 50 ms at most)
// means the process did not run: stopped, or starved of CPU. A timeout that follows such a
// stall within kRecentStall (the time to finish a step and wait again) blames the stall.
constexpr std::chrono::seconds kStallMin(1);
constexpr std::chrono::seconds kRecentStall(10);

namespace {

std::string Message(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace

// Why an op timed out when no liveness probe says more.
constexpr const char* kUnprobed =
    "another rank has failed, stopped, or issued ops on this communicator in a different order";

// The Work of one queued op: finished by the worker, waited on by the user thread.
class OpWork final : public Work {
 public:
  OpWork(std::weak_ptr<OpQueue> queue, OpLabel label, int world_rank,
         std::chrono::milliseconds timeout)
      : queue_(std::move(queue)),
        label_(std::move(label)),
        world_rank_(world_rank),
        timeout_(timeout) {}

  void Wait() override {
    const auto start = std::chrono::steady_clock::now();
    // Note [spin then block].
    while (!done_flag_.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() - start < kWaitSpin) {
      std::this_thread::yield();
    }
    if (!Done()) {
      if (std::exception_ptr earlier = EarlierFailure()) Throw(earlier);
    }
    std::exception_ptr error;
    bool done;
    {
      std::unique_lock<std::mutex> lock(mu_);
      done = cv_.wait_for(lock, timeout_, [&] { return done_; });
      error = error_;
    }
    if (!done) error = timed_out_ = std::make_exception_ptr(TimedOut(start));
    if (error) Throw(error);
  }

  bool Done() override { return done_flag_.load(std::memory_order_acquire); }

  void Finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = std::move(error);
      done_flag_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }

  std::string what() const { return label_.ToString(); }

 private:
  // An op still unfinished on a failed communicator will not finish in step with the other
  // ranks: a second full timeout (a destructor waiting for its ops, say) would only double
  // the time to the error. Nor will one once the workers have stopped (Note [Stopping the
  // workers]). Null otherwise.
  std::exception_ptr EarlierFailure() {
    if (timed_out_) return timed_out_;
    auto queue = queue_.lock();
    if (!queue) return nullptr;
    if (queue->runtime().stopping()) {
      return std::make_exception_ptr(CommError(
          StrCat(what(), " was abandoned: this process stopped its MPI work after a failure")));
    }
    const std::string why = queue->FailureMessage();
    if (why.empty()) return nullptr;
    return std::make_exception_ptr(
        CommError(StrCat(what(), " did not finish: this communicator failed earlier: ", why)));
  }

  // Under OnCommFailure::kStopProcess no worker calls MPI again once an error leaves Wait:
  // the caller may free buffers of ops MPI still holds (Note [Stopping the workers]).
  [[noreturn]] void Throw(const std::exception_ptr& error) {
    auto queue = queue_.lock();
    if (queue && queue->runtime().stop_on_failure()) queue->runtime().StopWorkers(kParkLimit);
    std::rethrow_exception(error);
  }

  // Makes the queue failed (the other ranks are no longer in step) and returns the error.
  CommError TimedOut(std::chrono::steady_clock::time_point start) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.2fs",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::string why = StrCat(kUnprobed, "."), behind;
    auto queue = queue_.lock();
    if (queue) {
      why = queue->WhyTimedOut(timeout_, start);
      std::shared_ptr<OpWork> oldest = queue->Oldest();
      if (oldest && oldest.get() != this) {
        behind = StrCat(" It was queued behind ", oldest->what(), ", which has not finished.");
      }
    }
    CommError error(StrCat("rank ", world_rank_, " waited ", seconds, " for ", what(), " (timeout ",
                           timeout_.count(), " ms): ", why, behind));
    if (queue) queue->Fail(std::make_exception_ptr(error));
    return error;
  }

  std::weak_ptr<OpQueue> queue_;
  OpLabel label_;
  int world_rank_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::atomic<bool> done_flag_{false};  // done_, readable without the lock
  std::exception_ptr error_;
  std::exception_ptr timed_out_;  // this op's timeout, once reported (Wait's thread only)
};

std::shared_ptr<OpQueue> OpQueue::Start(std::shared_ptr<MpiRuntime> runtime, CommInfo info,
                                        MemoryTracker* tracker) {
  std::shared_ptr<OpQueue> queue(new OpQueue(std::move(runtime), std::move(info), tracker));
  // The worker holds the queue, so an abandoned worker keeps what it polls alive. It is
  // checked in from here to after its last MPI call, which may be freeing the comms when it
  // drops the last reference (Note [Stopping the workers]).
  std::shared_ptr<MpiRuntime> rt = queue->runtime_;
  rt->CheckIn();
  queue->worker_ = std::thread([queue, rt]() mutable {
    queue->Run();
    queue.reset();
    rt->CheckOut();
  });
  return queue;
}

OpQueue::OpQueue(std::shared_ptr<MpiRuntime> runtime, CommInfo info, MemoryTracker* tracker)
    : runtime_(std::move(runtime)),
      comm_(std::move(info.comm)),
      ring_comm_(std::move(info.ring_comm)),
      probe_comm_(std::move(info.probe_comm)),
      world_ranks_(std::move(info.world_ranks)),
      hosts_(std::move(info.hosts)),
      scratch_(tracker),
      ctx_{comm_.get(), ring_comm_.get(), &scratch_},
      probe_(probe_comm_.get(), info.rank, info.size) {}

OpQueue::~OpQueue() = default;

std::string OpLabel::ToString() const {
  std::string s = op;
  if (nbytes >= 0) s += StrCat(" of ", nbytes, " bytes");
  return s + detail + " on " + (group ? *group : std::string("?"));
}

WorkPtr OpQueue::Submit(std::unique_ptr<MpiTask> task, bool p2p, OpLabel label,
                        std::chrono::milliseconds timeout) {
  auto work = std::make_shared<OpWork>(weak_from_this(), std::move(label), world_rank(), timeout);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_) {
      return FinishedWork(std::make_exception_ptr(CommError(StrCat(
          work->what(), " was not run: this communicator failed earlier: ", Message(failure_)))));
    }
    Pending pending;
    pending.task = std::move(task);
    pending.p2p = p2p;
    pending.work = work;
    queue_.push_back(std::move(pending));
    queued_.store(queue_.size(), std::memory_order_release);
  }
  cv_.notify_all();
  return work;
}

void OpQueue::Fail(std::exception_ptr error) {
  std::deque<Pending> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_) return;
    failure_ = error;
    dropped.swap(queue_);
    queued_.store(0, std::memory_order_release);
  }
  const std::string why = Message(error);
  for (Pending& p : dropped) {
    p.work->Finish(std::make_exception_ptr(
        CommError(StrCat(p.work->what(), " was not run: an earlier op failed: ", why))));
  }
  cv_.notify_all();
}

std::string OpQueue::FailureMessage() {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_ ? Message(failure_) : std::string();
}

std::shared_ptr<OpWork> OpQueue::Oldest() {
  std::lock_guard<std::mutex> lock(mu_);
  return oldest_;
}

void OpQueue::Shutdown(std::chrono::milliseconds grace) {
  bool exited;
  {
    std::unique_lock<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
    // A failed queue's in-flight ops may never finish, and a parked worker never exits
    // (Note [Stopping the workers]): do not wait for them.
    if ((failure_ && inflight_ > 0) || runtime_->stopping()) grace = std::chrono::milliseconds(0);
    exited = cv_.wait_for(lock, grace, [&] { return exited_; });
  }
  if (exited) {
    worker_.join();
  } else {
    worker_.detach();
    runtime_->NoteAbandoned();
  }
}

bool OpQueue::TakeStartable(const std::deque<Pending>& inflight, Pending* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty()) return false;
  // In flight is either one non-p2p op or only p2p ops (see the class comment).
  if (!inflight.empty() && !(queue_.front().p2p && inflight.back().p2p)) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  queued_.store(queue_.size(), std::memory_order_release);
  if (inflight_++ == 0) oldest_ = out->work;
  return true;
}

void OpQueue::StartOp(Pending& p) {
  try {
    p.task->Start(ctx_);
  } catch (const std::exception& e) {
    p.error = std::make_exception_ptr(CommError(StrCat(p.work->what(), ": ", e.what())));
    p.finished = true;
  }
}

void OpQueue::PollOp(Pending& p) {
  if (p.finished) return;
  try {
    p.finished = p.task->Progress(ctx_);
  } catch (const std::exception& e) {
    p.error = std::make_exception_ptr(CommError(StrCat(p.work->what(), ": ", e.what())));
    p.finished = true;
  }
}

void OpQueue::RetireFinished(std::deque<Pending>& inflight) {
  while (!inflight.empty() && inflight.front().finished) {
    Pending done = std::move(inflight.front());
    inflight.pop_front();
    {
      std::lock_guard<std::mutex> lock(mu_);
      --inflight_;
      oldest_ = inflight.empty() ? nullptr : inflight.front().work;
    }
    if (done.error) Fail(done.error);
    done.work->Finish(done.error);
  }
}

bool OpQueue::WaitForWork() {
  const auto idle_since = Clock::now();
  while (queued_.load(std::memory_order_acquire) == 0 && Clock::now() - idle_since < kIdleSpin) {
    std::this_thread::yield();  // Note [spin then block]
  }
  std::unique_lock<std::mutex> lock(mu_);
  // Not an endless wait: an idle worker still answers probes (Note [Liveness probe]).
  cv_.wait_for(lock, kIdleWake, [&] { return stop_ || !queue_.empty() || ProbeWanted(); });
  return !(stop_ && queue_.empty());
}

void OpQueue::ServeProbes() {
  if (probe_broken_) return;
  const auto now = Clock::now();
  NoteStall(now);
  try {
    if (now >= next_answer_) {
      probe_.Answer(/*reply=*/now >= mute_until_);
      next_answer_ = now + kAnswerEvery;
    }
    if (ProbeWanted()) StartProbe();
    if (probe_state_ == ProbeState::kRunning &&
        (probe_.Progress() || Clock::now() >= probe_deadline_)) {
      PublishLiveness(
          probe_.Finish(std::chrono::duration<double>(Clock::now() - probe_started_).count()));
    }
  } catch (const std::exception&) {
    // The probe comm is broken: this rank looks silent to the others from now on, and a
    // probe of its own reports nothing.
    probe_broken_ = true;
    if (probe_state_ != ProbeState::kNone) PublishLiveness(Liveness{});
  }
}

void OpQueue::NoteStall(Clock::time_point now) {
  const auto gap = now - last_serve_;
  last_serve_ = now;
  if (gap < kStallMin) return;
  // The pings that arrived meanwhile come from probes that began while this process did not
  // run: it did not answer them in time, and a late answer would make it look alive to a
  // probe that ends after it resumed (the launcher resumes a stopped rank to kill it).
  mute_until_ = now + kMaxProbeGrace;
  runtime_->NoteStall({now, gap});
}

void OpQueue::StartProbe() {
  std::chrono::milliseconds grace;
  {
    std::lock_guard<std::mutex> lock(mu_);
    grace = probe_grace_;
  }
  probe_state_ = ProbeState::kRunning;
  probe_started_ = Clock::now();
  probe_deadline_ = probe_started_ + grace;
  probe_.Start();
}

void OpQueue::PublishLiveness(Liveness liveness) {
  probe_state_ = ProbeState::kDone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    liveness_ = std::move(liveness);
  }
  probe_cv_.notify_all();
}

Liveness OpQueue::ProbeLiveness(std::chrono::milliseconds grace) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!probe_wanted_.load(std::memory_order_relaxed)) {
    probe_grace_ = grace;
    probe_wanted_.store(true, std::memory_order_release);
    cv_.notify_all();
  }
  probe_cv_.wait_for(lock, grace + kProbeMargin, [&] { return liveness_.has_value(); });
  return liveness_.value_or(Liveness{});
}

std::string OpQueue::WhyTimedOut(std::chrono::milliseconds timeout, Clock::time_point since) {
  // A stall of this process long enough to make the others time out explains the timeout;
  // a probe now would only find them gone (Note [Liveness probe]).
  const std::optional<MpiRuntime::Stall> stall = runtime_->LastStall();
  if (stall && stall->end >= since - kRecentStall &&
      stall->length >= std::max<Clock::duration>(kStallMin, timeout / 2)) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f s",
                  std::chrono::duration<double>(stall->length).count());
    return StrCat("this rank itself did not run for ", seconds,
                  " (the process was stopped, or starved of CPU), so the other ranks have "
                  "probably given up on it.");
  }
  const Liveness l = ProbeLiveness(std::min(kMaxProbeGrace, timeout));
  if (!l.known) {
    return StrCat(kUnprobed, " (no liveness probe: this rank's worker was blocked inside MPI).");
  }
  if (!l.silent.empty()) return DescribeSilent(l, world_ranks_, hosts_) + ".";
  return "every other rank answered a liveness probe, so none is stopped: one issued ops on "
         "this communicator in a different order, or is busy elsewhere (a long step, or a "
         "wait on another communicator).";
}

void OpQueue::Run() {
  std::deque<Pending> inflight;
  last_serve_ = Clock::now();
  for (;;) {
    // Note [Stopping the workers]: no MPI call once the process is aborting.
    if (runtime_->stopping()) runtime_->Park();
    Pending next;
    while (TakeStartable(inflight, &next)) {
      StartOp(next);
      inflight.push_back(std::move(next));
      next = Pending{};
    }
    for (Pending& p : inflight) PollOp(p);
    RetireFinished(inflight);
    ServeProbes();
    if (!inflight.empty() || probe_state_ == ProbeState::kRunning) {
      std::this_thread::yield();  // MPI progresses only inside MPI calls: keep polling
      continue;
    }
    if (!WaitForWork()) break;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    exited_ = true;
  }
  cv_.notify_all();
}

}  // namespace ztrain::comm::detail
