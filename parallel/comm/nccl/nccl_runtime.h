#pragma once
// CUDA and NCCL handles for the NCCL backend's own sources (this header includes
// cuda_runtime.h and nccl.h; nothing outside parallel/comm/nccl/ may include it).
//
// ZTRAIN_CUDA_CHECK and ZTRAIN_NCCL_CHECK turn a failed call into an exception naming it
// (Error for CUDA, CommError for NCCL). DeviceGuard makes a device current for one scope.
// CudaStream, CudaEvent, DeviceBuffer and PinnedBuffer own one handle each and free it in
// their destructors, which never throw. Backoff paces the polling loops.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <initializer_list>
#include <string>

#include "core/error.h"
#include "core/lazy_library.h"
#include "core/memory_tracker.h"

// Non-blocking communicators arrived in NCCL 2.14, ncclCommSplit in 2.18.
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the NCCL communicator needs NCCL >= 2.18; install it or set -DZTRAIN_WITH_NCCL=OFF"
#endif

namespace ztrain::comm::detail {

// libnccl, opened on first use (nccl_lazy.cc, Note [Lazy GPU libraries]).
LazyLibrary& NcclLibrary();

using ::ztrain::detail::StrCat;

// "out of memory (cudaErrorMemoryAllocation)".
std::string CudaErrorString(cudaError_t rc);
// "unhandled system error: <NCCL's last message>"; `comm` may be null.
std::string NcclErrorString(ncclResult_t rc, ncclComm_t comm = nullptr);

// Clears CUDA's last error too: a non-sticky failure must not be reported again by the next
// call's cudaGetLastError.
#define ZTRAIN_CUDA_CHECK(call)                                                           \
  do {                                                                                    \
    const cudaError_t ztrain_cuda_rc_ = (call);                                           \
    if (ztrain_cuda_rc_ != cudaSuccess) {                                                 \
      (void)cudaGetLastError();                                                           \
      throw ::ztrain::Error(::ztrain::detail::StrCat(                                     \
          #call, " failed: ", ::ztrain::comm::detail::CudaErrorString(ztrain_cuda_rc_))); \
    }                                                                                     \
  } while (0)

// For NCCL calls that never return ncclInProgress (those without a communicator).
#define ZTRAIN_NCCL_CHECK(call)                                                           \
  do {                                                                                    \
    const ncclResult_t ztrain_nccl_rc_ = (call);                                          \
    if (ztrain_nccl_rc_ != ncclSuccess)                                                   \
      throw ::ztrain::CommError(::ztrain::detail::StrCat(                                 \
          #call, " failed: ", ::ztrain::comm::detail::NcclErrorString(ztrain_nccl_rc_))); \
  } while (0)

// Makes `device` current and restores the previous device at the end of the scope (the
// engine's thread may use another device between ops).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// The owners below are made on the current device and freed on it again (whatever device is
// current when they are destroyed), as the runtime asks.

// A stream that does not synchronise with the legacy default stream.
class CudaStream {
 public:
  CudaStream();
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
};

// An event without timing (cheaper to record and query).
class CudaEvent {
 public:
  CudaEvent();
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  int device_ = -1;
  cudaEvent_t event_ = nullptr;
};

// Device memory, counted as kCommunication by `tracker` (may be null).
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, MemoryTracker* tracker);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return data_; }

 private:
  int device_ = -1;
  void* data_ = nullptr;
  size_t bytes_;
  MemoryTracker* tracker_;
};

// Page-locked host memory: copies to and from it never block the host.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return data_; }

 private:
  int device_ = -1;
  void* data_ = nullptr;
};

// Note [poll backoff]: a waiting thread first yields for a millisecond (most ops finish in
// tens of microseconds, and a sleep costs more than that in a VM), then sleeps 50 us,
// doubling up to 1 ms, so a long wait costs little CPU and notices completion within 1 ms.
class Backoff {
 public:
  void Pause();

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::microseconds sleep_{50};
};

// Polls `comms` (null entries are skipped) until none reports ncclInProgress or `deadline`
// passes. Returns the first error found, ncclInProgress when the deadline passed, else
// ncclSuccess. A non-blocking communicator reports ncclInProgress while it initialises,
// splits, connects to a peer for the first time or finalises.
ncclResult_t AwaitComms(std::initializer_list<ncclComm_t> comms,
                        std::chrono::steady_clock::time_point deadline);

}  // namespace ztrain::comm::detail
