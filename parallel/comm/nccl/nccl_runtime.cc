#include "parallel/comm/nccl/nccl_runtime.h"

#include <algorithm>
#include <thread>

namespace ztrain::comm::detail {

std::string CudaErrorString(cudaError_t rc) {
  return StrCat(cudaGetErrorString(rc), " (", cudaGetErrorName(rc), ")");
}

std::string NcclErrorString(ncclResult_t rc, ncclComm_t comm) {
  std::string s = ncclGetErrorString(rc);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') s += StrCat(": ", last);
  return s;
}

DeviceGuard::DeviceGuard(int device) {
  ZTRAIN_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) ZTRAIN_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) {
    (void)cudaSetDevice(previous_);
  }
}

namespace {

int CurrentDevice() {
  int device = -1;
  ZTRAIN_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// Runs `release` with `device` current, then restores the previous device. For destructors:
// never throws, and ignores failures (there is nothing left to do about them).
template <typename Fn>
void ReleaseOn(int device, Fn release) noexcept {
  int previous = -1;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device &&
                        cudaSetDevice(device) == cudaSuccess;
  if (release() != cudaSuccess) (void)cudaGetLastError();  // not the caller's error
  if (switched) (void)cudaSetDevice(previous);
}

}  // namespace

CudaStream::CudaStream() : device_(CurrentDevice()) {
  ZTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}
CudaStream::~CudaStream() {
  ReleaseOn(device_, [&] { return cudaStreamDestroy(stream_); });
}

CudaEvent::CudaEvent() : device_(CurrentDevice()) {
  ZTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}
CudaEvent::~CudaEvent() {
  ReleaseOn(device_, [&] { return cudaEventDestroy(event_); });
}

DeviceBuffer::DeviceBuffer(size_t bytes, MemoryTracker* tracker)
    : device_(CurrentDevice()), bytes_(bytes), tracker_(tracker) {
  const cudaError_t rc = cudaMalloc(&data_, bytes);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    throw OutOfMemoryError(StrCat("cudaMalloc of ", bytes, " bytes of NCCL scratch on cuda:",
                                  device_, " failed: ", CudaErrorString(rc)));
  }
  if (tracker_) tracker_->Allocated(MemoryCategory::kCommunication, static_cast<int64_t>(bytes_));
}
DeviceBuffer::~DeviceBuffer() {
  ReleaseOn(device_, [&] { return cudaFree(data_); });
  if (tracker_) tracker_->Freed(MemoryCategory::kCommunication, static_cast<int64_t>(bytes_));
}

PinnedBuffer::PinnedBuffer(size_t bytes) : device_(CurrentDevice()) {
  ZTRAIN_CUDA_CHECK(cudaMallocHost(&data_, bytes));
}
PinnedBuffer::~PinnedBuffer() {
  ReleaseOn(device_, [&] { return cudaFreeHost(data_); });
}

void Backoff::Pause() {  // Note [poll backoff]
  if (std::chrono::steady_clock::now() - start_ < std::chrono::milliseconds(1)) {
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(sleep_);
  sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
}

ncclResult_t AwaitComms(std::initializer_list<ncclComm_t> comms,
                        std::chrono::steady_clock::time_point deadline) {
  Backoff backoff;
  for (;;) {
    bool busy = false;
    for (ncclComm_t comm : comms) {
      if (comm == nullptr) continue;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
      if (rc != ncclSuccess) return rc;
      if (state == ncclInProgress) {
        busy = true;
      } else if (state != ncclSuccess) {
        return state;
      }
    }
    if (!busy) return ncclSuccess;
    if (std::chrono::steady_clock::now() >= deadline) return ncclInProgress;
    backoff.Pause();
  }
}

}  // namespace ztrain::comm::detail
