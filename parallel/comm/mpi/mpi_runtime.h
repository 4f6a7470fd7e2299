#pragma once
// MPI's process-wide state and handles, for the MPI backend's own sources only (this header
// includes mpi.h; nothing outside parallel/comm/mpi/ may include it).
//
// MpiRuntime initialises MPI once per process and finalises it when the last holder lets go
// (Note [MPI lifetime] in mpi_communicator.h). MpiComm is a move-only owner of an MPI_Comm.
// ZTRAIN_MPI_CHECK turns an MPI error code into a CommError naming the call.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace ztrain::comm::detail {

std::string MpiErrorString(int code);

#define ZTRAIN_MPI_CHECK(call)                                                          \
  do {                                                                                  \
    const int ztrain_mpi_rc_ = (call);                                                  \
    if (ztrain_mpi_rc_ != MPI_SUCCESS)                                                  \
      throw ::ztrain::CommError(::ztrain::detail::StrCat(                               \
          #call, " failed: ", ::ztrain::comm::detail::MpiErrorString(ztrain_mpi_rc_))); \
  } while (0)

// How long StopWorkers waits for the workers to park. A worker polls between MPI calls that
// return at once, so it parks within a poll; one blocked inside MPI (a Split) never does.
inline constexpr std::chrono::milliseconds kParkLimit(2000);

class MpiRuntime {
 public:
  // The process's runtime, initialising MPI on first use. Thread safe. Throws Error when MPI
  // was finalised already or lacks the thread support ztrain needs.
  static std::shared_ptr<MpiRuntime> Acquire();
  // The process's runtime when one is alive, else null; never initialises MPI.
  static std::shared_ptr<MpiRuntime> Current();
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int thread_level() const { return thread_level_; }
  int world_rank() const { return world_rank_; }
  // Throws CommError unless several communicators may call MPI at once.
  void RequireMultipleThreads(const char* why) const;
  // A worker was left polling an op MPI cannot cancel: MPI must not be finalised.
  void NoteAbandoned() { abandoned_.fetch_add(1); }

  // Note [Stopping the workers] (mpi_communicator.h). A worker thread checks in before its
  // first MPI call and out after its last.
  void CheckIn();
  void CheckOut();
  // True once StopWorkers() has begun: a worker makes no further MPI call and parks.
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  // Blocks the calling worker for good: the process is about to end.
  [[noreturn]] void Park();
  // Asks every worker to park and waits until all have, or `limit` has passed (a worker
  // blocked inside MPI cannot park); true when all parked. Thread safe.
  bool StopWorkers(std::chrono::milliseconds limit);
  // OnCommFailure::kStopProcess (mpi_communicator.h): a Wait() about to throw stops the
  // workers first. Set once, for every communicator of the process.
  void StopProcessOnFailure() { stop_on_failure_.store(true); }
  bool stop_on_failure() const { return stop_on_failure_.load(std::memory_order_relaxed); }

  // Note [Liveness probe] (op_queue.h): the last time a worker found that this process had
  // not run for a while (stopped or starved of CPU), for the errors of every communicator.
  struct Stall {
    std::chrono::steady_clock::time_point end;
    std::chrono::steady_clock::duration length{0};
  };
  void NoteStall(Stall stall);
  std::optional<Stall> LastStall();

 private:
  MpiRuntime(bool owns, int thread_level);

  bool owns_;
  int thread_level_;
  int world_rank_ = 0;
  std::atomic<int> abandoned_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stop_on_failure_{false};
  std::mutex workers_mu_;
  std::condition_variable workers_cv_;  // a worker parked or checked out
  int workers_ = 0;                     // checked in and not out
  int parked_ = 0;
  std::mutex stall_mu_;
  std::optional<Stall> stall_;
};

class MpiComm {
 public:
  MpiComm() = default;
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {}
  ~MpiComm() { Reset(); }
  MpiComm(MpiComm&& other) noexcept : comm_(other.comm_) { other.comm_ = MPI_COMM_NULL; }
  MpiComm& operator=(MpiComm&& other) noexcept;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  MPI_Comm get() const { return comm_; }
  void Reset() noexcept;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// A communicator's handles with what the Communicator reports about it.
struct CommInfo {
  MpiComm comm;
  MpiComm ring_comm;   // a duplicate for internal messages (Note [ring collectives])
  MpiComm probe_comm;  // a duplicate for liveness probes (Note [Liveness probe], op_queue.h)
  int rank = 0;
  int size = 1;
  std::vector<int> world_ranks;    // world rank of each member, in group order
  std::vector<std::string> hosts;  // host name of each member, in group order
};
// Sets MPI_ERRORS_RETURN on `comm` (so failures become CommErrors, not aborts), duplicates
// it for internal messages and reads its rank, size, members and their hosts. Takes
// ownership of `comm`. Collective over `comm`.
CommInfo DescribeComm(MPI_Comm comm);

}  // namespace ztrain::comm::detail
