#pragma once
// MPI's process-wide state and handles, for the MPI backend's own sources only (this header
// includes mpi.h; nothing outside parallel/comm/mpi/ may include it).
//
// MpiRuntime initialises MPI once per process and finalises it when the last holder lets go
// (Note [MPI lifetime] in mpi_communicator.h). MpiComm is a move-only owner of an MPI_Comm.
// ZTRAIN_MPI_CHECK turns an MPI error code into a CommError naming the call.
#include <mpi.h>

#include <atomic>
#include <memory>
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

class MpiRuntime {
 public:
  // The process's runtime, initialising MPI on first use. Thread safe. Throws Error when MPI
  // was finalised already or lacks the thread support ztrain needs.
  static std::shared_ptr<MpiRuntime> Acquire();
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int thread_level() const { return thread_level_; }
  int world_rank() const { return world_rank_; }
  // Throws CommError unless several communicators may call MPI at once.
  void RequireMultipleThreads(const char* why) const;
  // A worker was left polling an op MPI cannot cancel: MPI must not be finalised.
  void NoteAbandoned() { abandoned_.fetch_add(1); }

 private:
  MpiRuntime(bool owns, int thread_level);

  bool owns_;
  int thread_level_;
  int world_rank_ = 0;
  std::atomic<int> abandoned_{0};
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
  MpiComm ring_comm;  // a duplicate for internal messages (Note [ring collectives])
  int rank = 0;
  int size = 1;
  std::vector<int> world_ranks;  // world rank of each member, in group order
};
// Sets MPI_ERRORS_RETURN on `comm` (so failures become CommErrors, not aborts), duplicates
// it for internal messages and reads its rank, size and members. Takes ownership of `comm`.
// Collective over `comm`.
CommInfo DescribeComm(MPI_Comm comm);

}  // namespace ztrain::comm::detail
