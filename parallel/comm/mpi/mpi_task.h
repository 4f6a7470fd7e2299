#pragma once
// MpiTask: one communicator op as a state machine that the OpQueue worker drives (MPI
// backend only; includes mpi.h).
//
// The worker calls Start() once, then Progress() until it returns true; both run on the
// worker thread only and throw CommError on an MPI error. A task posts nonblocking requests
// and never blocks, except that a Split blocks in MPI_Comm_split once every rank has arrived.
// RequestTask wraps the common case: one nonblocking MPI call, then an optional step.
#include <functional>
#include <memory>

#include "core/allocator.h"
#include "core/buffer.h"
#include "parallel/comm/mpi/mpi_runtime.h"

namespace ztrain::comm::detail {

// Temporary host memory reused by one communicator's ops (counted as kCommunication by the
// tracker, when there is one). Used from the worker thread only.
class Scratch {
 public:
  explicit Scratch(MemoryTracker* tracker) : allocator_(tracker) {}
  // At least `bytes` bytes; invalidates what an earlier call returned.
  void* Get(size_t bytes);

 private:
  HostAllocator allocator_;
  Buffer buffer_;
};

// What a task may use on the worker.
struct WorkerContext {
  MPI_Comm comm;       // the communicator's handle: user p2p and MPI's own collectives
  MPI_Comm ring_comm;  // a private duplicate carrying the ring algorithms' messages
  Scratch* scratch;
};

class MpiTask {
 public:
  virtual ~MpiTask() = default;
  virtual void Start(WorkerContext& ctx) = 0;
  // Tests outstanding requests and advances; true once the op has finished.
  virtual bool Progress(WorkerContext& ctx) = 0;
};

class RequestTask final : public MpiTask {
 public:
  using StartFn = std::function<void(MPI_Comm, MPI_Request*)>;
  using FinishFn = std::function<void(MPI_Comm, const MPI_Status&)>;
  explicit RequestTask(StartFn start, FinishFn finish = nullptr)
      : start_(std::move(start)), finish_(std::move(finish)) {}

  void Start(WorkerContext& ctx) override { start_(ctx.comm, &request_); }
  bool Progress(WorkerContext& ctx) override;

 private:
  StartFn start_;
  FinishFn finish_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

}  // namespace ztrain::comm::detail
