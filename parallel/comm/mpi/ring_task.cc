#include "parallel/comm/mpi/ring_task.h"

#include <cstring>
#include <utility>

namespace ztrain::comm::detail {
namespace {

template <typename T>
void CombineAs(void* out, const void* a, const void* b, int64_t n, ReduceOp op) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (op == ReduceOp::kSum) {
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] > y[i] ? x[i] : y[i];
  }
}

// out = a (op) b, elementwise; out may be a or b.
void Combine(DType dtype, void* out, const void* a, const void* b, int64_t n, ReduceOp op) {
  if (dtype == DType::kF32) {
    CombineAs<float>(out, a, b, n, op);
  } else {
    CombineAs<int32_t>(out, a, b, n, op);
  }
}

}  // namespace

std::unique_ptr<RingTask> RingTask::AllReduce(const Tensor& buf, ReduceOp op, int rank, int size) {
  return std::unique_ptr<RingTask>(new RingTask(true, buf, buf, op, rank, size));
}

std::unique_ptr<RingTask> RingTask::ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op,
                                                  int rank, int size) {
  return std::unique_ptr<RingTask>(new RingTask(false, in, out, op, rank, size));
}

RingTask::RingTask(bool all_reduce, const Tensor& in, const Tensor& out, ReduceOp op, int rank,
                   int size)
    : all_reduce_(all_reduce),
      in_(static_cast<char*>(in.data())),
      out_(static_cast<char*>(out.data())),
      count_(in.numel()),
      dtype_(in.dtype()),
      elem_(DTypeSize(in.dtype())),
      op_(op),
      rank_(rank),
      size_(size),
      steps_(all_reduce ? 2 * (size - 1) : size - 1) {}

int64_t RingTask::ChunkBegin(int chunk) const {
  // All-reduce splits any count as evenly as it can; reduce-scatter chunks are equal.
  return all_reduce_ ? count_ * chunk / size_ : count_ / size_ * chunk;
}

void RingTask::Start(WorkerContext& ctx) {
  if (steps_ == 0) {  // a group of one
    if (out_ != in_) std::memmove(out_, in_, count_ * elem_);
    return;
  }
  const size_t max_chunk = static_cast<size_t>((count_ + size_ - 1) / size_) * elem_;
  recv_buf_ = static_cast<char*>(ctx.scratch->Get(all_reduce_ ? max_chunk : 2 * max_chunk));
  acc_buf_ = recv_buf_ + max_chunk;
  PostStep(ctx);
}

bool RingTask::Progress(WorkerContext& ctx) {
  if (step_ == steps_) return true;
  int flag = 0;
  ZTRAIN_MPI_CHECK(MPI_Testall(2, requests_, &flag, MPI_STATUSES_IGNORE));
  if (!flag) return false;
  FinishStep();
  if (++step_ == steps_) return true;
  PostStep(ctx);
  return false;
}

void RingTask::PostStep(WorkerContext& ctx) {
  auto mod = [this](int x) { return (x % size_ + size_) % size_; };
  const int reduce_steps = size_ - 1;
  int send_chunk;
  const char* send;
  char* recv;
  if (!all_reduce_) {  // partial sums travel: my input chunk first, then the accumulator
    send_chunk = mod(rank_ - step_ - 1);
    recv_chunk_ = mod(rank_ - step_ - 2);
    send = step_ == 0 ? Chunk(in_, send_chunk) : acc_buf_;
    recv = recv_buf_;
  } else if (step_ < reduce_steps) {  // all-reduce, reduce-scatter phase
    send_chunk = mod(rank_ - step_);
    recv_chunk_ = mod(rank_ - step_ - 1);
    send = Chunk(in_, send_chunk);
    recv = recv_buf_;
  } else {  // all-reduce, all-gather phase: reduced chunks arrive in place
    const int t = step_ - reduce_steps;
    send_chunk = mod(rank_ - t + 1);
    recv_chunk_ = mod(rank_ - t);
    send = Chunk(in_, send_chunk);
    recv = Chunk(in_, recv_chunk_);
  }
  const MPI_Datatype type = dtype_ == DType::kF32 ? MPI_FLOAT : MPI_INT32_T;
  const int next = mod(rank_ + 1), prev = mod(rank_ - 1);
  ZTRAIN_MPI_CHECK(MPI_Irecv(recv, static_cast<int>(ChunkSize(recv_chunk_)), type, prev, 0,
                             ctx.ring_comm, &requests_[0]));
  ZTRAIN_MPI_CHECK(MPI_Isend(send, static_cast<int>(ChunkSize(send_chunk)), type, next, 0,
                             ctx.ring_comm, &requests_[1]));
}

void RingTask::FinishStep() {
  const int64_t n = ChunkSize(recv_chunk_);
  char* mine = Chunk(in_, recv_chunk_);
  if (all_reduce_) {
    if (step_ < size_ - 1) Combine(dtype_, mine, mine, recv_buf_, n, op_);
  } else if (step_ == steps_ - 1) {
    Combine(dtype_, out_, recv_buf_, mine, n, op_);  // recv_chunk_ == rank_: the result
  } else {
    Combine(dtype_, recv_buf_, recv_buf_, mine, n, op_);
    std::swap(recv_buf_, acc_buf_);  // what arrived, plus mine, goes on next step
  }
}

}  // namespace ztrain::comm::detail
