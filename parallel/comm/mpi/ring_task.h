#pragma once
// Ring all-reduce and reduce-scatter on host memory (MPI backend only; includes mpi.h).
//
// Note [ring collectives]: MPI's nonblocking collectives (OpenMPI's libnbc) all-reduce in
// place with a binomial tree, which moves the whole buffer to one rank and back: about half
// the bandwidth of a blocking MPI_Allreduce. These tasks use the bandwidth-optimal ring
// (Patarasuk & Yuan 2009, as NCCL): N-1 steps in which every rank sends one chunk to the
// next rank while it receives one from the previous and reduces it into its own, then, for
// all-reduce, N-1 steps passing the reduced chunks on. Each rank sends exactly the bus
// bytes of comm_util.h. Messages travel on the communicator's private ring_comm, so they
// never match the user's Send/Recv. The input of an out-of-place reduce-scatter is left
// untouched (partial sums live in scratch memory).
#include "core/tensor.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/mpi/mpi_task.h"

namespace ztrain::comm::detail {

// Below this many bytes the ring's 2(N-1) latency-bound steps lose to MPI's own algorithms.
inline constexpr size_t kRingMinBytes = size_t{64} << 10;

class RingTask final : public MpiTask {
 public:
  // All-reduce of `buf` in place.
  static std::unique_ptr<RingTask> AllReduce(const Tensor& buf, ReduceOp op, int rank, int size);
  // Reduce-scatter of `in` (size equal chunks) into `out` (disjoint, or chunk `rank` of in).
  static std::unique_ptr<RingTask> ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op,
                                                 int rank, int size);

  void Start(WorkerContext& ctx) override;
  bool Progress(WorkerContext& ctx) override;

 private:
  RingTask(bool all_reduce, const Tensor& in, const Tensor& out, ReduceOp op, int rank, int size);
  int64_t ChunkBegin(int chunk) const;  // in elements
  int64_t ChunkSize(int chunk) const { return ChunkBegin(chunk + 1) - ChunkBegin(chunk); }
  char* Chunk(char* base, int chunk) const { return base + ChunkBegin(chunk) * elem_; }
  // Posts step_'s send and receive; reduces what the previous step received.
  void PostStep(WorkerContext& ctx);
  void FinishStep();

  bool all_reduce_;
  char* in_;
  char* out_;
  int64_t count_;  // elements of `in`
  DType dtype_;
  size_t elem_;
  ReduceOp op_;
  int rank_, size_;
  int step_ = 0;
  int steps_ = 0;
  char* recv_buf_ = nullptr;  // scratch: the chunk arriving this step
  char* acc_buf_ = nullptr;   // scratch (reduce-scatter): the partial sum sent next
  int recv_chunk_ = 0;
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

}  // namespace ztrain::comm::detail
