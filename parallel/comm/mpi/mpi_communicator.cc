#include "parallel/comm/mpi/mpi_communicator.h"

#include <climits>
#include <cstring>

#include "parallel/comm/comm_util.h"
#include "parallel/comm/mpi/mpi_runtime.h"
#include "parallel/comm/mpi/op_queue.h"
#include "parallel/comm/mpi/ring_task.h"

namespace ztrain::comm {
namespace {

using detail::RequestTask;
using detail::StrCat;

MPI_Datatype ReduceType(DType t) { return t == DType::kF32 ? MPI_FLOAT : MPI_INT32_T; }
MPI_Op ToMpi(ReduceOp op) { return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX; }

// MPI counts are ints.
int IntCount(const char* op, int64_t n) {
  ZTRAIN_CHECK(n <= INT_MAX, op, ": ", n,
               " elements or bytes exceed MPI's int count; split "
               "the buffer into smaller buckets");
  return static_cast<int>(n);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(std::shared_ptr<detail::MpiRuntime> runtime, detail::CommInfo info,
                  const std::string& label, std::chrono::milliseconds timeout,
                  MemoryTracker* tracker)
      : rank_(info.rank),
        size_(info.size),
        world_ranks_(info.world_ranks),
        name_(std::make_shared<const std::string>(detail::GroupName(label, world_ranks_))),
        timeout_(timeout),
        tracker_(tracker),
        runtime_(runtime),
        queue_(detail::OpQueue::Start(std::move(runtime), std::move(info), tracker)) {}
  ~MpiCommunicator() override { queue_->Shutdown(timeout_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return *name_; }
  void set_label(const std::string& label) override {
    // Ops already issued keep the old name (they share the string).
    name_ = std::make_shared<const std::string>(detail::GroupName(label, world_ranks_));
  }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  CommStats stats() const override { return stats_; }

  WorkPtr AllReduce(const Tensor& t, ReduceOp op) override {
    detail::CheckHost("AllReduce", t);
    detail::CheckReduce(t, op);
    const int count = IntCount("AllReduce", t.numel());
    if (t.nbytes() >= detail::kRingMinBytes) {  // Note [ring collectives]
      return Issue(OpKind::kAllReduce, t.nbytes(), "",
                   detail::RingTask::AllReduce(t, op, rank_, size_));
    }
    return Issue(
        OpKind::kAllReduce, t.nbytes(), "",
        std::make_unique<RequestTask>([data = t.data(), count, type = ReduceType(t.dtype()),
                                       mop = ToMpi(op)](MPI_Comm c, MPI_Request* r) {
          ZTRAIN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count, type, mop, c, r));
        }));
  }

  WorkPtr ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    detail::CheckHost("ReduceScatter", in);
    detail::CheckHost("ReduceScatter", out);
    const auto alias = detail::CheckReduceScatter(in, out, op, rank_, size_);
    const int count = IntCount("ReduceScatter", out.numel());
    if (in.nbytes() >= detail::kRingMinBytes) {  // Note [ring collectives]
      return Issue(OpKind::kReduceScatter, in.nbytes(), "",
                   detail::RingTask::ReduceScatter(in, out, op, rank_, size_));
    }
    const bool in_place = alias == detail::Alias::kInPlace;
    RequestTask::FinishFn finish;
    if (in_place && out.data() != in.data()) {
      // In place, MPI leaves this rank's result at the start of the buffer.
      finish = [from = in.data(), to = out.data(), n = out.nbytes()](MPI_Comm, const MPI_Status&) {
        std::memmove(to, from, n);
      };
    }
    return Issue(
        OpKind::kReduceScatter, in.nbytes(), "",
        std::make_unique<RequestTask>(
            [send = in_place ? MPI_IN_PLACE : in.data(), recv = in_place ? in.data() : out.data(),
             count, type = ReduceType(in.dtype()), mop = ToMpi(op)](MPI_Comm c, MPI_Request* r) {
              ZTRAIN_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, count, type, mop, c, r));
            },
            std::move(finish)));
  }

  WorkPtr AllGather(const Tensor& in, const Tensor& out) override {
    detail::CheckHost("AllGather", in);
    detail::CheckHost("AllGather", out);
    const bool in_place = detail::CheckAllGather(in, out, rank_, size_) == detail::Alias::kInPlace;
    const int bytes = IntCount("AllGather", static_cast<int64_t>(in.nbytes()));
    // In place, this rank's chunk is already in `out`.
    return Issue(
        OpKind::kAllGather, out.nbytes(), "",
        std::make_unique<RequestTask>(
            [send = in_place ? MPI_IN_PLACE : in.data(), recv = out.data(), bytes,
             send_type = in_place ? MPI_DATATYPE_NULL : MPI_BYTE](MPI_Comm c, MPI_Request* r) {
              ZTRAIN_MPI_CHECK(MPI_Iallgather(send, send == MPI_IN_PLACE ? 0 : bytes, send_type,
                                              recv, bytes, MPI_BYTE, c, r));
            }));
  }

  WorkPtr AllToAll(const Tensor& in, const Tensor& out) override {
    detail::CheckHost("AllToAll", in);
    detail::CheckHost("AllToAll", out);
    detail::CheckAllToAll(in, out, size_);
    const int bytes = IntCount("AllToAll", static_cast<int64_t>(in.nbytes() / size_));
    return Issue(
        OpKind::kAllToAll, in.nbytes(), "",
        std::make_unique<RequestTask>(
            [send = in.data(), recv = out.data(), bytes](MPI_Comm c, MPI_Request* r) {
              ZTRAIN_MPI_CHECK(MPI_Ialltoall(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, c, r));
            }));
  }

  WorkPtr Broadcast(const Tensor& t, int root) override {
    detail::CheckHost("Broadcast", t);
    detail::CheckRoot(root, size_);
    const int bytes = IntCount("Broadcast", static_cast<int64_t>(t.nbytes()));
    return Issue(
        OpKind::kBroadcast, t.nbytes(), StrCat(" from root ", root),
        std::make_unique<RequestTask>([data = t.data(), bytes, root](MPI_Comm c, MPI_Request* r) {
          ZTRAIN_MPI_CHECK(MPI_Ibcast(data, bytes, MPI_BYTE, root, c, r));
        }));
  }

  WorkPtr Send(const Tensor& t, int peer, int tag) override {
    detail::CheckHost("Send", t);
    detail::CheckPeer("Send", peer, rank_, size_, tag);
    const int bytes = IntCount("Send", static_cast<int64_t>(t.nbytes()));
    return Issue(OpKind::kSend, t.nbytes(), StrCat(" to rank ", peer, " (tag ", tag, ")"),
                 std::make_unique<RequestTask>(
                     [data = t.data(), bytes, peer, tag](MPI_Comm c, MPI_Request* r) {
                       ZTRAIN_MPI_CHECK(MPI_Isend(data, bytes, MPI_BYTE, peer, tag, c, r));
                     }),
                 /*p2p=*/true);
  }

  WorkPtr Recv(const Tensor& t, int peer, int tag) override {
    detail::CheckHost("Recv", t);
    detail::CheckPeer("Recv", peer, rank_, size_, tag);
    const int bytes = IntCount("Recv", static_cast<int64_t>(t.nbytes()));
    auto check_size = [bytes](MPI_Comm, const MPI_Status& status) {
      int got = 0;
      ZTRAIN_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &got));
      ZTRAIN_CHECK_T(CommError, got == bytes, "received ", got, " bytes, expected ", bytes);
    };
    return Issue(OpKind::kRecv, t.nbytes(), StrCat(" from rank ", peer, " (tag ", tag, ")"),
                 std::make_unique<RequestTask>(
                     [data = t.data(), bytes, peer, tag](MPI_Comm c, MPI_Request* r) {
                       ZTRAIN_MPI_CHECK(MPI_Irecv(data, bytes, MPI_BYTE, peer, tag, c, r));
                     },
                     check_size),
                 /*p2p=*/true);
  }

  WorkPtr Barrier() override {
    return Issue(OpKind::kBarrier, 0, "",
                 std::make_unique<RequestTask>(
                     [](MPI_Comm c, MPI_Request* r) { ZTRAIN_MPI_CHECK(MPI_Ibarrier(c, r)); }));
  }

  std::unique_ptr<Communicator> Split(int color, int key) override {
    ZTRAIN_CHECK(color >= 0, "Split: color ", color, " is negative");
    runtime_->RequireMultipleThreads("Split");
    // MPI_Comm_split blocks: a nonblocking barrier first makes sure every rank has arrived,
    // so the worker only blocks on a split that will finish.
    auto result = std::make_shared<detail::CommInfo>();
    auto task = std::make_unique<RequestTask>(
        [](MPI_Comm c, MPI_Request* r) { ZTRAIN_MPI_CHECK(MPI_Ibarrier(c, r)); },
        [result, color, key](MPI_Comm c, const MPI_Status&) {
          MPI_Comm split = MPI_COMM_NULL;
          ZTRAIN_MPI_CHECK(MPI_Comm_split(c, color, key, &split));
          *result = detail::DescribeComm(split);
        });
    queue_
        ->Submit(std::move(task), false,
                 {"Split", -1, StrCat("(color ", color, ", key ", key, ")"), name_}, timeout_)
        ->Wait();
    return std::make_unique<MpiCommunicator>(runtime_, std::move(*result), "group", timeout_,
                                             tracker_);
  }

 private:
  // Counts the op and queues it; `suffix` adds the root or peer to its description.
  WorkPtr Issue(OpKind kind, int64_t nbytes, std::string suffix,
                std::unique_ptr<detail::MpiTask> task, bool p2p = false) {
    detail::CountOp(stats_, kind, nbytes, size_);
    return queue_->Submit(std::move(task), p2p,
                          {OpKindName(kind), nbytes, std::move(suffix), name_}, timeout_);
  }

  int rank_;
  int size_;
  std::vector<int> world_ranks_;
  std::shared_ptr<const std::string> name_;
  std::chrono::milliseconds timeout_;
  MemoryTracker* tracker_;
  CommStats stats_;
  std::shared_ptr<detail::MpiRuntime> runtime_;
  std::shared_ptr<detail::OpQueue> queue_;
};

}  // namespace

std::unique_ptr<Communicator> MakeMpiWorld(std::chrono::milliseconds timeout,
                                           MemoryTracker* tracker, OnCommFailure on_failure) {
  auto runtime = detail::MpiRuntime::Acquire();
  if (on_failure == OnCommFailure::kStopProcess) runtime->StopProcessOnFailure();
  MPI_Comm world = MPI_COMM_NULL;
  ZTRAIN_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  return std::make_unique<MpiCommunicator>(runtime, detail::DescribeComm(world), "world", timeout,
                                           tracker);
}

}  // namespace ztrain::comm
