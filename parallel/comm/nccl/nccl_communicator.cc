#include "parallel/comm/nccl/nccl_communicator.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "parallel/comm/comm_util.h"
#include "parallel/comm/nccl/nccl_queue.h"

namespace ztrain::comm {
namespace {

using detail::NcclOpLabel;
using detail::NcclQueue;
using detail::StrCat;
using std::chrono::steady_clock;

ncclDataType_t ReduceType(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kI32:
      return ncclInt32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kU16:
    case DType::kU8:
      break;
  }
  ZTRAIN_ASSERT(false, "no NCCL reduction for ", DTypeName(t));
  return ncclFloat32;
}

ncclRedOp_t ToNccl(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

// Scratch per communicator: Barrier's int, and Split's (color, key, world rank) of each rank.
constexpr int kSplitInts = 3;
size_t ScratchBytes(int size) { return sizeof(int32_t) * kSplitInts * size; }

std::string DescribePointer(cudaError_t rc, const cudaPointerAttributes& attr) {
  if (rc != cudaSuccess) return StrCat("not a CUDA pointer (", detail::CudaErrorString(rc), ")");
  switch (attr.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
      return StrCat("memory of cuda:", attr.device);
    case cudaMemoryTypeHost:
      return "pinned host memory";
    default:
      return "host memory";
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclQueue> queue, int rank, std::vector<int> world_ranks,
                   const std::string& label)
      : queue_(std::move(queue)),
        rank_(rank),
        world_ranks_(std::move(world_ranks)),
        name_(std::make_shared<const std::string>(detail::GroupName(label, world_ranks_))) {}
  ~NcclCommunicator() override { queue_->Close(); }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  std::string name() const override { return *name_; }
  void set_label(const std::string& label) override {
    // Ops already issued keep the old name (they share the string).
    name_ = std::make_shared<const std::string>(detail::GroupName(label, world_ranks_));
  }
  std::chrono::milliseconds timeout() const override { return queue_->timeout(); }
  void set_timeout(std::chrono::milliseconds timeout) override { queue_->set_timeout(timeout); }
  CommStats stats() const override { return stats_; }

  WorkPtr AllReduce(const Tensor& t, ReduceOp op) override {
    CheckDevice("AllReduce", t);
    detail::CheckReduce(t, op, /*allow_16bit=*/true);
    return Issue(OpKind::kAllReduce, t, "",
                 [data = t.data(), n = static_cast<size_t>(t.numel()), type = ReduceType(t.dtype()),
                  rop = ToNccl(op)](ncclComm_t c, cudaStream_t s) {
                   return ncclAllReduce(data, data, n, type, rop, c, s);
                 });
  }

  WorkPtr ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    CheckDevice("ReduceScatter", in);
    CheckDevice("ReduceScatter", out);
    // In place, `out` is chunk rank() of `in`: exactly NCCL's in-place convention.
    detail::CheckReduceScatter(in, out, op, rank_, size(), /*allow_16bit=*/true);
    return Issue(OpKind::kReduceScatter, in, "",
                 [send = in.data(), recv = out.data(), n = static_cast<size_t>(out.numel()),
                  type = ReduceType(in.dtype()), rop = ToNccl(op)](ncclComm_t c, cudaStream_t s) {
                   return ncclReduceScatter(send, recv, n, type, rop, c, s);
                 });
  }

  WorkPtr AllGather(const Tensor& in, const Tensor& out) override {
    CheckDevice("AllGather", out);
    const bool from_host = in.device().is_cpu();
    if (!from_host) CheckDevice("AllGather", in);
    // In place, `in` is chunk rank() of `out`: NCCL's in-place convention. Any dtype moves as
    // bytes.
    detail::CheckAllGather(in, out, rank_, size());
    if (from_host) {
      // An offloaded shard (communicator.h): copied into this rank's chunk on the stream,
      // after the ops issued before (so `out` may be memory they freed), then gathered in
      // place. A pageable `in` is staged by the driver before the copy call returns.
      return Issue(OpKind::kAllGather, out, " from host memory",
                   [send = in.data(), recv = out.data(), n = in.nbytes(),
                    chunk = static_cast<char*>(out.data()) + in.nbytes() * rank_](
                       ncclComm_t c, cudaStream_t s) {
                     ZTRAIN_CUDA_CHECK(
                         cudaMemcpyAsync(chunk, send, n, cudaMemcpyHostToDevice, s));
                     return ncclAllGather(chunk, recv, n, ncclUint8, c, s);
                   });
    }
    return Issue(
        OpKind::kAllGather, out, "",
        [send = in.data(), recv = out.data(), n = in.nbytes()](ncclComm_t c, cudaStream_t s) {
          return ncclAllGather(send, recv, n, ncclUint8, c, s);
        });
  }

  // NCCL has no all-to-all: a group of a send and a receive per peer (NCCL's own recipe).
  WorkPtr AllToAll(const Tensor& in, const Tensor& out) override {
    CheckDevice("AllToAll", in);
    CheckDevice("AllToAll", out);
    detail::CheckAllToAll(in, out, size());
    return Issue(OpKind::kAllToAll, in, "",
                 [send = static_cast<const char*>(in.data()), recv = static_cast<char*>(out.data()),
                  chunk = in.nbytes() / static_cast<size_t>(size()),
                  n = size()](ncclComm_t c, cudaStream_t s) {
                   ncclResult_t r = ncclGroupStart();
                   for (int peer = 0; peer < n && r == ncclSuccess; ++peer) {
                     r = ncclSend(send + chunk * peer, chunk, ncclUint8, peer, c, s);
                     if (r == ncclSuccess) {
                       r = ncclRecv(recv + chunk * peer, chunk, ncclUint8, peer, c, s);
                     }
                   }
                   const ncclResult_t end = ncclGroupEnd();
                   return r != ncclSuccess ? r : end;
                 });
  }

  WorkPtr Broadcast(const Tensor& t, int root) override {
    CheckDevice("Broadcast", t);
    detail::CheckRoot(root, size());
    return Issue(OpKind::kBroadcast, t, StrCat(" from root ", root),
                 [data = t.data(), n = t.nbytes(), root](ncclComm_t c, cudaStream_t s) {
                   return ncclBroadcast(data, data, n, ncclUint8, root, c, s);
                 });
  }

  WorkPtr Send(const Tensor& t, int peer, int tag) override {
    CheckDevice("Send", t);
    detail::CheckPeer("Send", peer, rank_, size(), tag);
    detail::CountOp(stats_, OpKind::kSend, t.nbytes(), size());
    return queue_->P2p(Label(OpKind::kSend, t, StrCat(" to rank ", peer, " (tag ", tag, ")")),
                       {true, t.data(), t.nbytes(), peer});
  }

  WorkPtr Recv(const Tensor& t, int peer, int tag) override {
    CheckDevice("Recv", t);
    detail::CheckPeer("Recv", peer, rank_, size(), tag);
    detail::CountOp(stats_, OpKind::kRecv, t.nbytes(), size());
    return queue_->P2p(Label(OpKind::kRecv, t, StrCat(" from rank ", peer, " (tag ", tag, ")")),
                       {false, t.data(), t.nbytes(), peer});
  }

  WorkPtr Barrier() override {
    detail::CountOp(stats_, OpKind::kBarrier, 0, size());
    return queue_->Collective({OpKindName(OpKind::kBarrier), -1, DType::kI32, "", name_},
                              [flag = queue_->scratch()](ncclComm_t c, cudaStream_t s) {
                                return ncclAllReduce(flag, flag, 1, ncclInt32, ncclSum, c, s);
                              });
  }

  std::unique_ptr<Communicator> Split(int color, int key) override {
    ZTRAIN_CHECK(color >= 0, "Split: color ", color, " is negative");
    const NcclOpLabel label{"Split", -1, DType::kI32, StrCat(" (color ", color, ", key ", key, ")"),
                            name_};
    const std::vector<int32_t> all = ExchangeSplitArguments(color, key, label);
    // NCCL orders a split group by key, then by rank in the parent (as MPI_Comm_split).
    std::vector<int> members;  // parent ranks
    for (int r = 0; r < size(); ++r) {
      if (all[kSplitInts * r] == color) members.push_back(r);
    }
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return all[kSplitInts * a + 1] < all[kSplitInts * b + 1];
    });
    std::vector<int> world_ranks;
    int new_rank = -1;
    for (int r : members) {
      if (r == rank_) new_rank = static_cast<int>(world_ranks.size());
      world_ranks.push_back(all[kSplitInts * r + 2]);
    }
    ncclComm_t child = queue_->SplitComm(color, key, label);
    int nccl_rank = -1, nccl_size = -1;
    if (ncclCommUserRank(child, &nccl_rank) != ncclSuccess ||
        ncclCommCount(child, &nccl_size) != ncclSuccess || nccl_rank != new_rank ||
        nccl_size != static_cast<int>(world_ranks.size())) {
      (void)ncclCommAbort(child);
      ZTRAIN_ASSERT(false, "Split: NCCL made rank ", nccl_rank, " of ", nccl_size,
                    ", the exchanged arguments say rank ", new_rank, " of ", world_ranks.size());
    }
    auto queue = NcclQueue::Create(child, queue_->device(), world_ranks[new_rank],
                                   ScratchBytes(nccl_size), queue_->tracker(), queue_->timeout());
    return std::make_unique<NcclCommunicator>(std::move(queue), new_rank, std::move(world_ranks),
                                              "group");
  }

 private:
  void CheckDevice(const char* op, const Tensor& t) const {
    const int device = queue_->device();
    ZTRAIN_CHECK(t.device() == Device::Cuda(device), op,
                 ": the NCCL communicator moves memory on cuda:", device, ", got a tensor on ",
                 t.device().ToString(),
                 t.device().is_cpu() ? " (copy it to the GPU, or use the MPI communicator for "
                                       "host memory)"
                                     : " (use a communicator made for that device)");
    if (t.numel() == 0) return;
    // A tensor labelled cuda:N may still hold a host pointer; NCCL's kernel would fault on it
    // and poison the CUDA context of the whole process. One driver query per tensor is cheap
    // next to a collective.
    cudaPointerAttributes attr{};
    const cudaError_t rc = cudaPointerGetAttributes(&attr, t.data());
    if (rc != cudaSuccess) (void)cudaGetLastError();
    const bool on_device =
        rc == cudaSuccess &&
        (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) &&
        attr.device == device;
    ZTRAIN_CHECK(on_device, op, ": the tensor says cuda:", device, " but its pointer ", t.data(),
                 " is ", DescribePointer(rc, attr),
                 " (allocate it with cudaMalloc on cuda:", device, ")");
  }

  NcclOpLabel Label(OpKind kind, const Tensor& t, std::string suffix) const {
    return {OpKindName(kind), t.numel(), t.dtype(), std::move(suffix), name_};
  }

  // Counts the op and launches it; `suffix` adds the root to its description.
  WorkPtr Issue(OpKind kind, const Tensor& t, std::string suffix,
                const NcclQueue::LaunchFn& launch) {
    detail::CountOp(stats_, kind, t.nbytes(), size());
    return queue_->Collective(Label(kind, t, std::move(suffix)), launch);
  }

  // (color, key, world rank) of every rank, all-gathered on the device through the scratch
  // (not counted: the user did not ask for it). Throws CommError when the all-gather fails.
  std::vector<int32_t> ExchangeSplitArguments(int color, int key, const NcclOpLabel& label) {
    auto* staging = static_cast<int32_t*>(queue_->staging());
    auto* scratch = static_cast<int32_t*>(queue_->scratch());
    int32_t* mine = scratch + kSplitInts * rank_;
    staging[0] = color;
    staging[1] = key;
    staging[2] = world_ranks_[rank_];
    queue_
        ->Collective(label,
                     [=](ncclComm_t c, cudaStream_t s) {
                       // Pinned source: the copy runs in stream order, after earlier ops.
                       ZTRAIN_CUDA_CHECK(cudaMemcpyAsync(
                           mine, staging, sizeof(int32_t) * kSplitInts, cudaMemcpyHostToDevice, s));
                       return ncclAllGather(mine, scratch, kSplitInts, ncclInt32, c, s);
                     })
        ->Wait();
    // The all-gather has finished and the stream is idle, so this copy does not wait.
    std::vector<int32_t> all(static_cast<size_t>(kSplitInts) * size());
    detail::DeviceGuard guard(queue_->device());
    ZTRAIN_CUDA_CHECK(
        cudaMemcpy(all.data(), scratch, all.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    return all;
  }

  std::shared_ptr<NcclQueue> queue_;
  int rank_;
  std::vector<int> world_ranks_;
  std::shared_ptr<const std::string> name_;
  CommStats stats_;
};

// The NCCL id from rank 0 of `bootstrap`, with a flag first so that when rank 0 cannot make
// one, every rank fails with the same message instead of waiting for a broadcast.
ncclUniqueId BroadcastUniqueId(Communicator& bootstrap) {
  static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0);
  std::array<int32_t, 1 + sizeof(ncclUniqueId) / sizeof(int32_t)> message{};
  std::string error;
  if (bootstrap.rank() == 0) {
    ncclUniqueId id;
    const ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc == ncclSuccess) {
      message[0] = 1;
      std::memcpy(&message[1], &id, sizeof id);
    } else {
      error = detail::NcclErrorString(rc);
    }
  }
  bootstrap
      .Broadcast(Tensor(message.data(), DType::kI32, {static_cast<int64_t>(message.size())}), 0)
      ->Wait();
  ZTRAIN_CHECK_T(CommError, message[0] == 1,
                 bootstrap.rank() == 0 ? StrCat("ncclGetUniqueId failed: ", error)
                                       : StrCat("rank 0 of ", bootstrap.name(),
                                                " could not create the NCCL id (see its error)"));
  ncclUniqueId id;
  std::memcpy(&id, &message[1], sizeof id);
  return id;
}

}  // namespace

std::unique_ptr<Communicator> MakeNcclCommunicator(Communicator& bootstrap, int device,
                                                   std::chrono::milliseconds timeout,
                                                   MemoryTracker* tracker) {
  const int rank = bootstrap.rank(), size = bootstrap.size();
  const int visible = VisibleCudaDevices();
  ZTRAIN_CHECK(visible > 0, "the NCCL communicator needs a GPU, but rank ", rank,
               " sees no CUDA device (check the driver with nvidia-smi and CUDA_VISIBLE_DEVICES, "
               "or use the MPI communicator)");
  ZTRAIN_CHECK(device >= 0 && device < visible, "NCCL communicator: device ", device,
               " is not one of the ", visible, " CUDA devices rank ", rank,
               " sees (use the local rank modulo the device count; check CUDA_VISIBLE_DEVICES)");
  ZTRAIN_CUDA_CHECK(cudaSetDevice(device));  // NCCL binds the communicator to this device
  const ncclUniqueId id = BroadcastUniqueId(bootstrap);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // Note [NCCL timeouts]: every wait on NCCL stays bounded
  ncclComm_t comm = nullptr;
  const auto start = steady_clock::now();
  ncclResult_t rc = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (rc == ncclSuccess || rc == ncclInProgress) {
    rc = detail::AwaitComms({comm}, start + timeout);
  }
  if (rc != ncclSuccess) {
    const std::string why =
        rc == ncclInProgress
            ? StrCat("rank ", rank, " waited ", timeout.count(), " ms for the other ranks of ",
                     bootstrap.name(),
                     " to join the NCCL communicator: a rank has failed, stopped, or has no "
                     "usable GPU")
            : StrCat("rank ", rank, ": ncclCommInitRankConfig on cuda:", device,
                     " failed: ", detail::NcclErrorString(rc, comm),
                     " (NCCL needs one GPU per rank; set NCCL_DEBUG=WARN for details)");
    if (comm != nullptr) (void)ncclCommAbort(comm);
    throw CommError(why);
  }
  std::vector<int> world_ranks(size);
  for (int r = 0; r < size; ++r) world_ranks[r] = r;
  auto queue = NcclQueue::Create(comm, device, rank, ScratchBytes(size), tracker, timeout);
  return std::make_unique<NcclCommunicator>(std::move(queue), rank, std::move(world_ranks),
                                            "world");
}

bool HaveNccl() { return detail::NcclLibrary().Available(); }

int VisibleCudaDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no GPU: not an error for the caller
    return 0;
  }
  return count;
}

}  // namespace ztrain::comm
