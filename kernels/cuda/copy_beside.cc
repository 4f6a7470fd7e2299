// CudaOps' host<->device copies beside the ops (Note [Copies beside the ops] in ops.h), and
// Synchronize, which waits for them too.
//
// The copies run on their own non-blocking stream, so the copy engine moves them while the
// ops' stream computes. Each copy first waits for an event (`issued_`, reused) recorded on
// the ops' stream when it is issued: its dst is often fresh memory from the stream-ordered pool, which ops issued
// earlier may still be using. Its completion event is kept under its ticket until WaitCopy
// makes the ops' stream wait for it (cudaStreamWaitEvent: on the device, the host goes on)
// or Synchronize sees every copy finish. The stream is non-blocking so that the legacy
// default stream, where NCCL orders its collectives after the ops (Note [NCCL timeouts]),
// does not wait for the copies: a collective issued after a copy waits for it only when
// WaitCopy was issued before the collective.
#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"

namespace ztrain::kernels::cuda {

CopyTicket CudaOps::CopyBeside(const Tensor& src, const Tensor& dst) {
  constexpr const char* kOp = "CopyBeside";
  const bool src_host = src.device().is_cpu(), dst_host = dst.device().is_cpu();
  CheckOnDevice(src, src_host ? Device::Cpu() : device(), kOp, "src");
  CheckOnDevice(dst, dst_host ? Device::Cpu() : device(), kOp, "dst");
  ZTRAIN_CHECK(src_host != dst_host, kOp, ": src and dst are both ",
               src_host ? "host memory" : device().ToString(),
               "; it copies between the host and the device (use Copy)");
  ZTRAIN_CHECK(dst.shape() == src.shape(), kOp, ": dst has shape ", ShapeToString(dst.shape()),
               ", expected ", ShapeToString(src.shape()), " (src's)");
  ZTRAIN_CHECK(dst.dtype() == src.dtype(), kOp, ": src has dtype ", DTypeName(src.dtype()),
               " and dst ", DTypeName(dst.dtype()),
               "; it moves bytes only (convert with Copy, on the ops' stream)");
  if (src.nbytes() == 0) return {};
  if (copy_stream_ == nullptr) {
    ZTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  }
  if (issued_ == nullptr) {
    ZTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&issued_, cudaEventDisableTiming));
  }
  // `issued_` may be recorded again as soon as the wait on it is enqueued.
  ZTRAIN_CUDA_CHECK(cudaEventRecord(issued_, stream_));
  ZTRAIN_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, issued_, 0));
  ZTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, copy_stream_));
  cudaEvent_t done = nullptr;
  ZTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(done, copy_stream_);
  if (recorded != cudaSuccess) cudaEventDestroy(done);
  ZTRAIN_CUDA_CHECK(recorded);
  copies_.emplace(++last_copy_, done);
  return {last_copy_};
}

void CudaOps::WaitCopy(CopyTicket ticket) {
  const auto it = copies_.find(ticket.id);
  if (it == copies_.end()) return;  // nothing to wait for, waited for, or synchronised
  const cudaEvent_t done = it->second;
  copies_.erase(it);
  const cudaError_t rc = cudaStreamWaitEvent(stream_, done, 0);
  cudaEventDestroy(done);
  ZTRAIN_CUDA_CHECK(rc);
}

void CudaOps::Synchronize() {
  if (copy_stream_ != nullptr) {
    ZTRAIN_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
    for (const auto& [ticket, done] : copies_) cudaEventDestroy(done);
    copies_.clear();
  }
  ZTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace ztrain::kernels::cuda
