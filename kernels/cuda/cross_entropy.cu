// Fused softmax + cross-entropy over a padded vocabulary on the GPU (ops.h contract): one
// block per row computes the row's max and sum of exp in a single online pass, writes the
// loss, and, when dlosses is given, overwrites the row with its gradient. Probabilities are
// never stored: the gradient pass recomputes exp(x - max) from the logits it overwrites.
//
// Note [Cross-entropy target check]: targets live on the device, so checking them costs a
// small kernel, an 8-byte copy back and a stream synchronisation per call (microseconds,
// but the host waits for all work queued before). It runs before the main kernel, so a bad
// target throws with the logits and losses untouched, as every op leaves its outputs when
// it throws.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"

namespace ztrain::kernels::cuda {
namespace {

constexpr int kRowThreads = 512;
constexpr unsigned long long kNoBadRow = ~0ull;

// Running (max, sum of exp(x - max)) of a set of logits; max = -inf while it is empty.
struct SoftmaxStats {
  float max = -INFINITY;
  float sum = 0.0f;

  __device__ void Add(float x) {
    if (x > max) {
      sum = sum * expf(max - x) + 1.0f;  // expf(-inf) = 0 while empty
      max = x;
    } else if (max > -INFINITY) {  // x <= max = -inf adds exp(-inf) = 0
      sum += expf(x - max);
    }
  }
  __device__ void Merge(SoftmaxStats o) {
    if (o.max == -INFINITY) return;
    if (max == -INFINITY) {
      *this = o;
      return;
    }
    const float m = fmaxf(max, o.max);
    sum = sum * expf(max - m) + o.sum * expf(o.max - m);
    max = m;
  }
};

// Stats of the whole block, in every thread; the merge order is fixed by the thread layout.
// shared_max and shared_sum hold kRowThreads / 32 floats.
__device__ SoftmaxStats BlockStats(SoftmaxStats s, float* shared_max, float* shared_sum) {
  for (int o = 16; o > 0; o /= 2) {
    SoftmaxStats other;
    other.max = __shfl_xor_sync(0xffffffffu, s.max, o);
    other.sum = __shfl_xor_sync(0xffffffffu, s.sum, o);
    s.Merge(other);
  }
  if (threadIdx.x % 32 == 0) {
    shared_max[threadIdx.x / 32] = s.max;
    shared_sum[threadIdx.x / 32] = s.sum;
  }
  __syncthreads();
  SoftmaxStats total;
  for (int w = 0; w < kRowThreads / 32; ++w) total.Merge({shared_max[w], shared_sum[w]});
  return total;
}

// losses[n] = logsumexp(row[0, vocab)) - row[target]; with dlosses, row becomes
// (softmax - onehot(target)) * dlosses[n] on [0, vocab) and 0 on [vocab, vp).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    CrossEntropyKernel(T* logits, const int32_t* targets, int64_t vocab, int64_t vp,
                       float* losses, const float* dlosses) {
  __shared__ float shared_max[kRowThreads / 32], shared_sum[kRowThreads / 32];
  T* row = logits + static_cast<int64_t>(blockIdx.x) * vp;
  const int32_t target = targets[blockIdx.x];
  const float target_logit = ToFloat(row[target]);  // read before any thread overwrites it
  SoftmaxStats stats;
  for (int64_t j = threadIdx.x; j < vocab; j += kRowThreads) stats.Add(ToFloat(row[j]));
  stats = BlockStats(stats, shared_max, shared_sum);  // its __syncthreads orders the reads above before writes
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(stats.sum) + stats.max - target_logit;
  if (dlosses == nullptr) return;
  const float dloss = dlosses[blockIdx.x];
  const float scale = dloss / stats.sum;
  for (int64_t j = threadIdx.x; j < vocab; j += kRowThreads) {
    float g = expf(ToFloat(row[j]) - stats.max) * scale;
    if (j == target) g -= dloss;
    row[j] = FromFloat<T>(g);
  }
  for (int64_t j = vocab + threadIdx.x; j < vp; j += kRowThreads) row[j] = FromFloat<T>(0.0f);
}

// *first_bad = the smallest row whose target is outside [0, vocab) (integer atomicMin: the
// same answer whatever the scheduling); left alone when every target is valid.
__global__ void FindBadTargetKernel(const int32_t* targets, int64_t rows, int64_t vocab,
                                    unsigned long long* first_bad) {
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t t = targets[r];
    if (t < 0 || t >= vocab) atomicMin(first_bad, static_cast<unsigned long long>(r));
  }
}

}  // namespace

void CudaOps::SoftmaxCrossEntropy(const Tensor& logits, const Tensor& targets, int64_t vocab,
                                  const Tensor& losses, const Tensor& dlosses) {
  constexpr const char* kOp = "SoftmaxCrossEntropy";
  CheckFloat(logits, device(), kOp, "logits");
  ZTRAIN_CHECK(logits.dim() >= 1, kOp, ": logits must be [N, Vp], got a scalar");
  const int64_t vp = logits.size(-1);
  ZTRAIN_CHECK(vocab > 0 && vocab <= vp, kOp, ": vocab = ", vocab, " must be in [1, Vp = ", vp,
               "] (logits ", ShapeToString(logits.shape()), ")");
  const int64_t rows = RowsOf(logits, vp, kOp, "logits");
  CheckOnDevice(targets, device(), DType::kI32, kOp, "targets");
  CheckCount(targets, rows, kOp, "targets");
  CheckOnDevice(losses, device(), DType::kF32, kOp, "losses");
  CheckCount(losses, rows, kOp, "losses");
  if (dlosses.defined()) {
    CheckOnDevice(dlosses, device(), DType::kF32, kOp, "dlosses");
    CheckCount(dlosses, rows, kOp, "dlosses");
  }
  CheckInt32(rows, kOp, "N (rows of logits)");
  if (rows == 0) return;

  // Note [Cross-entropy target check].
  auto* first_bad = static_cast<unsigned long long*>(Workspace(sizeof(unsigned long long)));
  ZTRAIN_CUDA_CHECK(cudaMemsetAsync(first_bad, 0xff, sizeof(*first_bad), stream_));
  FindBadTargetKernel<<<GridFor(rows), kThreads, 0, stream_>>>(targets.data<const int32_t>(),
                                                               rows, vocab, first_bad);
  ZTRAIN_CUDA_CHECK_LAUNCH();
  unsigned long long bad_row = kNoBadRow;
  ZTRAIN_CUDA_CHECK(cudaMemcpyAsync(&bad_row, first_bad, sizeof(bad_row),
                                    cudaMemcpyDeviceToHost, stream_));
  ZTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (bad_row != kNoBadRow) {
    int32_t bad_target = 0;
    ZTRAIN_CUDA_CHECK(cudaMemcpyAsync(&bad_target, targets.data<const int32_t>() + bad_row,
                                      sizeof(bad_target), cudaMemcpyDeviceToHost, stream_));
    ZTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    ZTRAIN_CHECK(false, kOp, ": target ", bad_target, " at row ", bad_row,
                 " is outside [0, ", vocab, ")");
  }

  const float* dl = dlosses.defined() ? dlosses.data<const float>() : nullptr;
  DispatchFloat(logits.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    CrossEntropyKernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, stream_>>>(
        logits.data<T>(), targets.data<const int32_t>(), vocab, vp, losses.data<float>(), dl);
  });
  ZTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace ztrain::kernels::cuda
