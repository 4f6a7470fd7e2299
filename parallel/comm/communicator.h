#pragma once
// Communicator: collectives and point-to-point messages among the ranks of one group
// (DESIGN.md "Communication").
//
// Every op is asynchronous: it returns a Work handle at once and runs in the order ops were
// issued on this communicator (the MPI backend on one worker thread, the NCCL backend on one
// stream). Buffers must stay valid and untouched until Wait() returns. Wait() throws
// CommError naming the op, its size and the peer/group when the op fails or does not finish
// within the communicator's timeout; after a failure the communicator is unusable.
// Each op counts the bytes it moves per rank in the ring/bus convention NCCL reports
// (all-reduce 2(N-1)/N of the buffer, reduce-scatter and all-gather (N-1)/N of the full
// buffer, broadcast and send/recv the buffer), so volumes can be checked against the ZeRO
// formulas. A Communicator is used from one thread (the engine's); its ops may run on others.
// Reductions take fp32 or int32 tensors (the NCCL backend also bf16 and fp16); the other ops
// move any dtype. Bad arguments (wrong sizes, dtype, device, peer or root) throw
// ztrain::Error from the issuing call itself.
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ztrain::comm {

enum class ReduceOp { kSum, kMax };

enum class OpKind : int {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kSend,
  kRecv,
  kBarrier,
  kAllToAll
};
inline constexpr int kNumOpKinds = 8;
const char* OpKindName(OpKind k);

// Bytes moved and ops issued, per op kind.
struct CommStats {
  std::array<int64_t, kNumOpKinds> bytes{};
  std::array<int64_t, kNumOpKinds> ops{};
  int64_t Bytes(OpKind k) const { return bytes[static_cast<int>(k)]; }
  int64_t TotalBytes() const;
};

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the op is done; throws CommError on failure or timeout.
  virtual void Wait() = 0;
  // True when the op has finished (successfully or not: Wait() then reports which).
  virtual bool Done() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // A short description for messages, e.g. "dp group of 4 (world ranks 0,2,4,6)".
  virtual std::string name() const = 0;
  // Sets the first words of name(), e.g. "dp group" (Split's result starts as "group").
  virtual void set_label(const std::string& label) = 0;
  // How long Wait() blocks before it throws CommError. A Split inherits its parent's.
  virtual std::chrono::milliseconds timeout() const = 0;
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;

  // In place: every rank ends with the reduction of all ranks' `t`.
  virtual WorkPtr AllReduce(const Tensor& t, ReduceOp op = ReduceOp::kSum) = 0;
  // `in` holds size() equal chunks; rank r receives the reduction of chunk r into `out`.
  // `out` is either disjoint from `in` or exactly chunk rank() of it (in place; the rest of
  // `in` is then clobbered).
  virtual WorkPtr ReduceScatter(const Tensor& in, const Tensor& out,
                                ReduceOp op = ReduceOp::kSum) = 0;
  // `out` holds size() chunks of in.numel(); chunk r comes from rank r. `in` is either
  // disjoint from `out` or exactly chunk rank() of it (in place). A communicator of device
  // memory (NCCL) also takes `in` in host memory, a shard offloaded there: it copies it into
  // chunk rank() on its own stream, after the ops issued before, and gathers in place, so the
  // copy runs beside the compute issued after it (page-locked `in` for the copy to be
  // asynchronous). `in` must not change until the op has finished.
  virtual WorkPtr AllGather(const Tensor& in, const Tensor& out) = 0;
  // `in` and `out` hold size() equal chunks each (one dtype, the same size, disjoint): chunk j
  // of `in` goes to rank j, where it becomes chunk rank() of that rank's `out`
  // (MPI_Alltoall): context parallelism's exchange of sequence pieces for heads
  // (DeepSpeed-Ulysses). Any dtype moves as bytes.
  virtual WorkPtr AllToAll(const Tensor& in, const Tensor& out) = 0;
  virtual WorkPtr Broadcast(const Tensor& t, int root) = 0;
  // Consecutive Send/Recv ops may be in flight together (as inside an NCCL group), so two
  // ranks that both send first and then receive do not deadlock; such ops must not share
  // buffers. Every other op starts only after all earlier ops have finished.
  virtual WorkPtr Send(const Tensor& t, int peer, int tag) = 0;
  virtual WorkPtr Recv(const Tensor& t, int peer, int tag) = 0;
  virtual WorkPtr Barrier() = 0;
  // A sub-communicator of the ranks passing the same `color`, ordered by `key` (MPI_Comm_split).
  // Collective: every rank of this communicator must call it.
  virtual std::unique_ptr<Communicator> Split(int color, int key) = 0;

  virtual CommStats stats() const = 0;
};

// A group of one rank: every collective completes at once and moves no bytes (the
// reduction of one rank is its own data). What a single process without a launcher uses.
// Out-of-place ReduceScatter and AllGather copy their input with `copy` (src, dst): by
// default a host memmove; an engine on a GPU gives its ops' Copy.
using CopyFn = std::function<void(const Tensor& src, const Tensor& dst)>;
std::unique_ptr<Communicator> MakeSelfCommunicator(CopyFn copy = nullptr);

// Every rank's `text`, cut to `max_bytes` - 1 bytes, on every rank, in rank order: for
// messages and small values the ranks compare (host memory only). Collective.
std::vector<std::string> AllGatherText(Communicator& comm, const std::string& text,
                                       int64_t max_bytes = 256);
// Every rank's `values`, the same count on every rank, concatenated in rank order. Collective.
std::vector<int32_t> AllGatherInts(Communicator& comm, const std::vector<int32_t>& values);

}  // namespace ztrain::comm
