#include "parallel/comm/mpi/op_queue.h"

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
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout_, [&] { return done_; })) {
      lock.unlock();
      throw TimedOut(std::chrono::steady_clock::now() - start);
    }
    if (error_) std::rethrow_exception(error_);
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
  // Makes the queue failed (the other ranks are no longer in step) and returns the error.
  CommError TimedOut(std::chrono::steady_clock::duration waited) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.2fs", std::chrono::duration<double>(waited).count());
    std::string behind;
    auto queue = queue_.lock();
    if (queue) {
      std::shared_ptr<OpWork> oldest = queue->Oldest();
      if (oldest && oldest.get() != this) {
        behind = StrCat(" It was queued behind ", oldest->what(), ", which has not finished.");
      }
    }
    CommError error(StrCat("rank ", world_rank_, " waited ", seconds, " for ", what(), " (timeout ",
                           timeout_.count(),
                           " ms): another rank has failed, stopped, "
                           "or issued ops on this communicator in a different order.",
                           behind));
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
};

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

std::shared_ptr<OpQueue> OpQueue::Start(std::shared_ptr<MpiRuntime> runtime, CommInfo info,
                                        MemoryTracker* tracker) {
  std::shared_ptr<OpQueue> queue(new OpQueue(std::move(runtime), std::move(info), tracker));
  // The worker holds the queue, so an abandoned worker keeps what it polls alive.
  queue->worker_ = std::thread([queue] { queue->Run(); });
  return queue;
}

OpQueue::OpQueue(std::shared_ptr<MpiRuntime> runtime, CommInfo info, MemoryTracker* tracker)
    : runtime_(std::move(runtime)),
      comm_(std::move(info.comm)),
      ring_comm_(std::move(info.ring_comm)),
      scratch_(tracker),
      ctx_{comm_.get(), ring_comm_.get(), &scratch_} {}

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
    // A failed queue's in-flight ops may never finish: do not wait for them.
    if (failure_ && inflight_ > 0) grace = std::chrono::milliseconds(0);
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

void OpQueue::Run() {
  std::deque<Pending> inflight;
  for (;;) {
    Pending next;
    while (TakeStartable(inflight, &next)) {
      StartOp(next);
      inflight.push_back(std::move(next));
      next = Pending{};
    }
    for (Pending& p : inflight) PollOp(p);
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
    if (!inflight.empty()) {
      std::this_thread::yield();  // MPI progresses only inside MPI_Test: keep polling
      continue;
    }
    const auto idle_since = std::chrono::steady_clock::now();
    while (queued_.load(std::memory_order_acquire) == 0 &&
           std::chrono::steady_clock::now() - idle_since < kIdleSpin) {
      std::this_thread::yield();  // Note [spin then block]
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_ && queue_.empty()) break;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    exited_ = true;
  }
  cv_.notify_all();
}

}  // namespace ztrain::comm::detail
