#pragma once
// LivenessProbe: which members of a communicator still answer, asked when an op has timed
// out (MPI backend only; includes mpi.h). Note [Liveness probe] in op_queue.h.
//
// Used by one OpQueue's worker thread only, on the queue's private probe communicator (a
// duplicate, so that pings never match the user's messages). Answer() replies to the pings
// of other members; Start(), Progress() and Finish() run this member's own probe. Nothing
// blocks: each call makes nonblocking MPI calls and returns. MPI errors throw CommError.
#include <string>
#include <vector>

#include "parallel/comm/mpi/mpi_runtime.h"

namespace ztrain::comm::detail {

// What a probe found, in group ranks of the probed communicator.
struct Liveness {
  bool known = false;         // false: no probe ran (the worker did not get to it in time)
  std::vector<int> silent;    // members that did not answer within the grace
  std::vector<int> answered;  // members that did
  double seconds = 0;         // how long the probe waited
};

class LivenessProbe {
 public:
  LivenessProbe(MPI_Comm comm, int rank, int size);
  ~LivenessProbe();
  LivenessProbe(const LivenessProbe&) = delete;
  LivenessProbe& operator=(const LivenessProbe&) = delete;

  // Takes every ping that has arrived, and answers them when `reply` (Note [Liveness
  // probe]: a process that has just run again after a stall drops the pings it got meanwhile).
  void Answer(bool reply);
  // Pings every other member. At most once per communicator: a late answer to a finished
  // probe would be taken for an answer to the next one.
  void Start();
  bool active() const { return active_; }
  // Tests for answers; true once every other member has answered.
  bool Progress();
  // Ends the probe, cancelling the receives of members that did not answer.
  Liveness Finish(double seconds);

 private:
  void CancelPending() noexcept;

  MPI_Comm comm_;
  int rank_;
  int size_;
  bool active_ = false;
  int pending_ = 0;                   // members yet to answer
  std::vector<MPI_Request> answers_;  // one receive per member (null for this rank)
  std::vector<int> words_;            // their buffers
  std::vector<bool> answered_;
};

// Describes `l` for an error message, naming members by world rank and host, e.g.
// "rank 0 (host a) does not answer: it is stopped, hung or too slow; ranks 2 and 3
// answered within 3.0 s". Empty when the probe found nothing silent or did not run.
std::string DescribeSilent(const Liveness& l, const std::vector<int>& world_ranks,
                           const std::vector<std::string>& hosts);

}  // namespace ztrain::comm::detail
