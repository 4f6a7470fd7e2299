// Fused softmax + cross-entropy over a padded vocabulary on the GPU (ops.h contract): one
// block per row computes the row's max and sum of exp in a single online pass, writes the
// loss, and, when dlosses is given, overwrites the row with its gradient. Probabilities are
// never stored: the gradient pass recomputes exp(x - max) from the logits it overwrites.
// The vocabulary-parallel cross-entropy (ops.h) splits the same computation into its steps
// around the tp group's all-reduces: a block per row for the max and for the sum of exp (plain
// fp32 reductions in a fixed order), elementwise kernels for the losses and the gradient.
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
#include "kernels/vocab_slice_check.h"

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
  if (target == kIgnoreTarget) {  // no loss, no gradient
    if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
    if (dlosses == nullptr) return;
    for (int64_t j = threadIdx.x; j < vp; j += kRowThreads) row[j] = FromFloat<T>(0.0f);
    return;
  }
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

// *first_bad = the smallest row whose target is outside [0, vocab) and not kIgnoreTarget
// (integer atomicMin: the same answer whatever the scheduling); left alone when every target
// is valid.
__global__ void FindBadTargetKernel(const int32_t* targets, int64_t rows, int64_t vocab,
                                    unsigned long long* first_bad) {
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t t = targets[r];
    if (t != kIgnoreTarget && (t < 0 || t >= vocab)) atomicMin(first_bad, static_cast<unsigned long long>(r));
  }
}

// Throws naming the first of `rows` targets outside [0, vocab), if any (Note [Cross-entropy
// target check]).
void CheckTargets(CudaOps& ops, const Tensor& targets, int64_t rows, int64_t vocab,
                  const char* op) {
  cudaStream_t stream = ops.stream();
  auto* first_bad = static_cast<unsigned long long*>(ops.Workspace(sizeof(unsigned long long)));
  ZTRAIN_CUDA_CHECK(cudaMemsetAsync(first_bad, 0xff, sizeof(*first_bad), stream));
  FindBadTargetKernel<<<GridFor(rows), kThreads, 0, stream>>>(targets.data<const int32_t>(),
                                                              rows, vocab, first_bad);
  ZTRAIN_CUDA_CHECK_LAUNCH();
  unsigned long long bad_row = kNoBadRow;
  ZTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(&bad_row, first_bad, sizeof(bad_row), cudaMemcpyDeviceToHost, stream));
  ZTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (bad_row == kNoBadRow) return;
  int32_t bad_target = 0;
  ZTRAIN_CUDA_CHECK(cudaMemcpyAsync(&bad_target, targets.data<const int32_t>() + bad_row,
                                    sizeof(bad_target), cudaMemcpyDeviceToHost, stream));
  ZTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream));
  ZTRAIN_CHECK(false, op, ": target ", bad_target, " at row ", bad_row, " is outside [0, ", vocab,
               ") and is not the ignored target ", kIgnoreTarget);
}

// The vocabulary-parallel cross-entropy's kernels (ops.h): one block of kThreads per row for
// the two reductions, whose order is fixed by the thread layout; elementwise for the rest.
// `real` is how many of the row's `cols` logits are real tokens.
template <typename T>
__global__ void SliceMaxKernel(const T* logits, int64_t cols, int64_t real, float* max) {
  __shared__ float shared[kThreads / 32];
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < real; j += kThreads) m = fmaxf(m, ToFloat(row[j]));
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, shared[w]);
  max[blockIdx.x] = m;
}

// stats [3, rows]: reads the max (row 0), writes the sum of exp (row 1) and the target logit
// (row 2, 0 when the slice does not hold the target).
template <typename T>
__global__ void SliceSumExpKernel(const T* logits, int64_t cols, int64_t real,
                                  const int32_t* targets, int64_t begin, int64_t rows,
                                  float* stats) {
  __shared__ float shared[kThreads / 32];
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * cols;
  const float m = stats[blockIdx.x];
  float acc = 0.0f;
  for (int64_t j = threadIdx.x; j < real; j += kThreads) acc += expf(ToFloat(row[j]) - m);
  acc = BlockSum(acc, shared);
  if (threadIdx.x != 0) return;
  stats[rows + blockIdx.x] = acc;
  const int64_t local = targets[blockIdx.x] - begin;
  stats[2 * rows + blockIdx.x] = local >= 0 && local < real ? ToFloat(row[local]) : 0.0f;
}

__global__ void SliceLossKernel(const float* stats, const int32_t* targets, int64_t rows,
                                float* losses) {
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    losses[r] = targets[r] == kIgnoreTarget
                    ? 0.0f
                    : logf(stats[rows + r]) + stats[r] - stats[2 * rows + r];
  }
}

// Each logit becomes its gradient in place: one thread per element.
template <typename T>
__global__ void SliceCrossEntropyGradKernel(T* logits, int64_t cols, int64_t real,
                                            const int32_t* targets, int64_t begin,
                                            const float* stats, int64_t rows,
                                            const float* dlosses) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, j = i - r * cols;
    float g = 0.0f;
    if (j < real && targets[r] != kIgnoreTarget) {
      g = expf(ToFloat(logits[i]) - stats[r]) * (dlosses[r] / stats[rows + r]);
      if (j == targets[r] - begin) g -= dlosses[r];
    }
    logits[i] = FromFloat<T>(g);
  }
}

// The sizes of a vocabulary-parallel cross-entropy call, its arguments checked.
struct SliceDims {
  int64_t rows, cols, real;
};

SliceDims CheckSliceArgs(Device device, const Tensor& logits, const Tensor& targets,
                         const VocabSlice& slice, const Tensor& stats, const char* op) {
  CheckFloat(logits, device, op, "logits");
  ZTRAIN_CHECK(logits.dim() == 2, op, ": logits must be [N, Vl], got ",
               ShapeToString(logits.shape()));
  const int64_t rows = logits.size(0), cols = logits.size(1);
  CheckColumnSlice(slice, op);
  CheckOnDevice(targets, device, DType::kI32, op, "targets");
  CheckCount(targets, rows, op, "targets");
  CheckOnDevice(stats, device, DType::kF32, {3, rows}, op, "stats");
  CheckInt32(rows, op, "N (rows of logits)");
  return {rows, cols, slice.RealRows(cols)};
}

}  // namespace

void CudaOps::VocabParallelCrossEntropy(CrossEntropyStep step, const Tensor& logits,
                                        const Tensor& targets, const VocabSlice& slice,
                                        const Tensor& stats, const Tensor& losses) {
  constexpr const char* kOp = "VocabParallelCrossEntropy";
  const SliceDims d = CheckSliceArgs(device(), logits, targets, slice, stats, kOp);
  if (step == CrossEntropyStep::kLoss) {
    CheckOnDevice(losses, device(), DType::kF32, kOp, "losses");
    CheckCount(losses, d.rows, kOp, "losses");
  }
  if (d.rows == 0) return;
  float* s = stats.data<float>();
  if (step == CrossEntropyStep::kLoss) {
    SliceLossKernel<<<GridFor(d.rows), kThreads, 0, stream_>>>(
        s, targets.data<const int32_t>(), d.rows, losses.data<float>());
    ZTRAIN_CUDA_CHECK_LAUNCH();
    return;
  }
  if (step == CrossEntropyStep::kMax) CheckTargets(*this, targets, d.rows, slice.vocab, kOp);
  DispatchFloat(logits.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const unsigned blocks = static_cast<unsigned>(d.rows);
    if (step == CrossEntropyStep::kMax) {
      SliceMaxKernel<T><<<blocks, kThreads, 0, stream_>>>(logits.data<const T>(), d.cols, d.real,
                                                          s);
    } else {
      SliceSumExpKernel<T><<<blocks, kThreads, 0, stream_>>>(
          logits.data<const T>(), d.cols, d.real, targets.data<const int32_t>(), slice.begin,
          d.rows, s);
    }
  });
  ZTRAIN_CUDA_CHECK_LAUNCH();
}

void CudaOps::VocabParallelCrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                                const VocabSlice& slice, const Tensor& stats,
                                                const Tensor& dlosses) {
  constexpr const char* kOp = "VocabParallelCrossEntropyBackward";
  const SliceDims d = CheckSliceArgs(device(), logits, targets, slice, stats, kOp);
  CheckOnDevice(dlosses, device(), DType::kF32, kOp, "dlosses");
  CheckCount(dlosses, d.rows, kOp, "dlosses");
  if (d.rows * d.cols == 0) return;
  DispatchFloat(logits.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    SliceCrossEntropyGradKernel<T><<<GridFor(d.rows * d.cols), kThreads, 0, stream_>>>(
        logits.data<T>(), d.cols, d.real, targets.data<const int32_t>(), slice.begin,
        stats.data<const float>(), d.rows, dlosses.data<const float>());
  });
  ZTRAIN_CUDA_CHECK_LAUNCH();
}

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

  CheckTargets(*this, targets, rows, vocab, kOp);  // Note [Cross-entropy target check]

  const float* dl = dlosses.defined() ? dlosses.data<const float>() : nullptr;
  DispatchFloat(logits.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    CrossEntropyKernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, stream_>>>(
        logits.data<T>(), targets.data<const int32_t>(), vocab, vp, losses.data<float>(), dl);
  });
  ZTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace ztrain::kernels::cuda
