#include "parallel/comm/comm_util.h"

#include <sstream>

#include "core/error.h"

namespace ztrain::comm::detail {
namespace {

class DoneWork final : public Work {
 public:
  explicit DoneWork(std::exception_ptr error) : error_(std::move(error)) {}
  void Wait() override {
    if (error_) std::rethrow_exception(error_);
  }
  bool Done() override { return true; }

 private:
  std::exception_ptr error_;
};

bool Overlaps(const Tensor& a, const Tensor& b) {
  const char* pa = static_cast<const char*>(a.data());
  const char* pb = static_cast<const char*>(b.data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// Whether `part` is exactly chunk `rank` of `whole` (chunks of part.numel() elements).
bool IsChunk(const Tensor& part, const Tensor& whole, int rank) {
  const char* chunk = static_cast<const char*>(whole.data()) + part.nbytes() * rank;
  return part.data() == chunk;
}

}  // namespace

int64_t BusBytes(OpKind kind, int64_t nbytes, int n) {
  if (n <= 1) return 0;
  switch (kind) {
    case OpKind::kAllReduce:
      return 2 * (n - 1) * nbytes / n;
    case OpKind::kReduceScatter:
    case OpKind::kAllGather:
    case OpKind::kAllToAll:  // each rank keeps its own chunk and sends the n - 1 others
      return (n - 1) * nbytes / n;
    case OpKind::kBroadcast:
    case OpKind::kSend:
    case OpKind::kRecv:
      return nbytes;
    case OpKind::kBarrier:
      return 0;
  }
  return 0;
}

void CountOp(CommStats& stats, OpKind kind, int64_t nbytes, int n) {
  stats.bytes[static_cast<int>(kind)] += BusBytes(kind, nbytes, n);
  stats.ops[static_cast<int>(kind)] += 1;
}

void CheckReduce(const Tensor& t, ReduceOp /*op*/, bool allow_16bit) {
  const DType d = t.dtype();
  if (allow_16bit) {
    ZTRAIN_CHECK(d == DType::kF32 || d == DType::kI32 || d == DType::kBF16 || d == DType::kF16,
                 "reductions take fp32, bf16, fp16 or int32 tensors, got ", DTypeName(d));
    return;
  }
  ZTRAIN_CHECK(d == DType::kF32 || d == DType::kI32, "reductions take fp32 or int32 tensors, got ",
               DTypeName(d), " (convert 16-bit gradients to fp32 before reducing)");
}

Alias CheckReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op, int rank, int size,
                         bool allow_16bit) {
  CheckReduce(in, op, allow_16bit);
  ZTRAIN_CHECK(in.dtype() == out.dtype(), "ReduceScatter: input is ", DTypeName(in.dtype()),
               " but output is ", DTypeName(out.dtype()));
  ZTRAIN_CHECK(in.numel() == out.numel() * size, "ReduceScatter: input has ", in.numel(),
               " elements, expected ", size, " chunks of the output's ", out.numel(),
               " (pad the buffer to a multiple of the group size)");
  if (!Overlaps(in, out)) return Alias::kDisjoint;
  ZTRAIN_CHECK(IsChunk(out, in, rank),
               "ReduceScatter: the output overlaps the input but is "
               "not this rank's chunk of it (rank ",
               rank, ")");
  return Alias::kInPlace;
}

Alias CheckAllGather(const Tensor& in, const Tensor& out, int rank, int size) {
  ZTRAIN_CHECK(in.dtype() == out.dtype(), "AllGather: input is ", DTypeName(in.dtype()),
               " but output is ", DTypeName(out.dtype()));
  ZTRAIN_CHECK(out.numel() == in.numel() * size, "AllGather: output has ", out.numel(),
               " elements, expected ", size, " chunks of the input's ", in.numel());
  if (!Overlaps(in, out)) return Alias::kDisjoint;
  ZTRAIN_CHECK(IsChunk(in, out, rank),
               "AllGather: the input overlaps the output but is "
               "not this rank's chunk of it (rank ",
               rank, ")");
  return Alias::kInPlace;
}

void CheckAllToAll(const Tensor& in, const Tensor& out, int size) {
  ZTRAIN_CHECK(in.dtype() == out.dtype(), "AllToAll: input is ", DTypeName(in.dtype()),
               " but output is ", DTypeName(out.dtype()));
  ZTRAIN_CHECK(in.numel() == out.numel() && in.numel() % size == 0, "AllToAll: input has ",
               in.numel(), " elements and output ", out.numel(), "; both must hold ", size,
               " equal chunks");
  ZTRAIN_CHECK(!Overlaps(in, out) || (in.data() == out.data() && size == 1),
               "AllToAll: the input and the output overlap");
}

void CheckRoot(int root, int size) {
  ZTRAIN_CHECK(root >= 0 && root < size, "Broadcast: root ", root, " is not a rank of a group of ",
               size);
}

void CheckPeer(const char* op, int peer, int rank, int size, int tag) {
  ZTRAIN_CHECK(peer >= 0 && peer < size, op, ": peer ", peer, " is not a rank of a group of ",
               size);
  ZTRAIN_CHECK(peer != rank, op, ": rank ", rank, " cannot message itself");
  ZTRAIN_CHECK(tag >= 0, op, ": tag ", tag, " is negative");
}

void CheckHost(const char* op, const Tensor& t) {
  ZTRAIN_CHECK(t.device().is_cpu(), op, ": this communicator moves host memory, got a tensor on ",
               t.device().ToString(), " (use the NCCL communicator for device memory)");
}

std::string GroupName(const std::string& label, const std::vector<int>& world_ranks) {
  std::ostringstream os;
  os << label << " of " << world_ranks.size();
  if (label == "world") return os.str();
  os << " (world ranks ";
  const size_t n = world_ranks.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 16 && i == 8) {
      os << ",...," << world_ranks[n - 1];
      break;
    }
    os << (i ? "," : "") << world_ranks[i];
  }
  os << ")";
  return os.str();
}

WorkPtr FinishedWork(std::exception_ptr error) {
  return std::make_shared<DoneWork>(std::move(error));
}

}  // namespace ztrain::comm::detail
