// LayerNorm over the last dimension, eps = 1e-5 (GPT-2), on the GPU; the same arithmetic as
// kernels/cpu/layernorm.cc (two-pass variance, fp32 statistics) on fp32 or bf16 tensors.
//
// Forward and the input gradient take one warp per row (a row's reduction is a fixed
// butterfly, so the bits do not change between runs). The parameter gradients are summed
// over rows without atomics: pass 1 writes per-chunk column partials into the workspace,
// pass 2 adds a column's partials in chunk order into dweight/dbias. Both passes read dy and
// x before the dx kernel writes, so dx may alias either.
#include <algorithm>

#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"

namespace ztrain::kernels::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kRowsPerBlock = kThreads / 32;  // one warp per row
constexpr int kColTile = 32;                  // parameter-gradient block: 32 channels ...
constexpr int kRowLanes = 8;                  // ... by 8 row lanes
constexpr int64_t kMinRowsPerChunk = 64;
constexpr int64_t kMaxChunks = 65535;  // gridDim.y limit

int64_t RowsPerChunk(int64_t rows) {
  return std::max(kMinRowsPerChunk, (rows + kMaxChunks - 1) / kMaxChunks);
}
int64_t Chunks(int64_t rows) { return (rows + RowsPerChunk(rows) - 1) / RowsPerChunk(rows); }

template <typename T>
__global__ void LayerNormForwardKernel(const T* x, const T* w, const T* b, int64_t rows,
                                       int64_t ch, T* y, float* mean_out, float* rstd_out) {
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // a whole warp leaves together: the shuffles stay full
  const T* xr = x + row * ch;
  T* yr = y + row * ch;
  float sum = 0.0f;
  for (int64_t c = lane; c < ch; c += 32) sum += ToFloat(xr[c]);
  const float mean = WarpSum(sum) / static_cast<float>(ch);
  float var = 0.0f;  // two passes: no cancellation when |mean| >> std
  for (int64_t c = lane; c < ch; c += 32) {
    const float d = ToFloat(xr[c]) - mean;
    var += d * d;
  }
  const float rstd = 1.0f / sqrtf(WarpSum(var) / static_cast<float>(ch) + kEps);
  for (int64_t c = lane; c < ch; c += 32) {
    yr[c] = FromFloat<T>((ToFloat(xr[c]) - mean) * rstd * ToFloat(w[c]) + ToFloat(b[c]));
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// dx = rstd * (w dy - mean(w dy) - xhat * mean(w dy xhat)), xhat = (x - mean) * rstd. Each
// lane reads dy[c] and x[c] before writing dx[c] at the same index, so dx may alias them.
template <typename T>
__global__ void LayerNormInputGradKernel(const T* dy, const T* x, const T* w,
                                         const float* mean, const float* rstd, int64_t rows,
                                         int64_t ch, T* dx) {
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* gr = dy + row * ch;
  const T* xr = x + row * ch;
  T* dxr = dx + row * ch;
  const float m = mean[row], s = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t c = lane; c < ch; c += 32) {
    const float g = ToFloat(w[c]) * ToFloat(gr[c]);
    sum_g += g;
    sum_gx += g * (ToFloat(xr[c]) - m) * s;
  }
  const float mean_g = WarpSum(sum_g) / static_cast<float>(ch);
  const float mean_gx = WarpSum(sum_gx) / static_cast<float>(ch);
  for (int64_t c = lane; c < ch; c += 32) {
    const float xhat = (ToFloat(xr[c]) - m) * s;
    dxr[c] = FromFloat<T>((ToFloat(w[c]) * ToFloat(gr[c]) - mean_g - xhat * mean_gx) * s);
  }
}

// Pass 1 of dweight/dbias: block (tile, chunk) sums dy * xhat and dy over the chunk's rows
// for 32 channels, row lane y taking every 8th row, then the lanes in order.
template <typename T>
__global__ void LayerNormParamPartialKernel(const T* dy, const T* x, const float* mean,
                                            const float* rstd, int64_t rows, int64_t ch,
                                            int64_t rows_per_chunk, float* partial_w,
                                            float* partial_b) {
  __shared__ float shared_w[kRowLanes][kColTile + 1];
  __shared__ float shared_b[kRowLanes][kColTile + 1];
  const int64_t c = int64_t{blockIdx.x} * kColTile + threadIdx.x;
  const int64_t r0 = int64_t{blockIdx.y} * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc_w = 0.0f, acc_b = 0.0f;
  if (c < ch) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const float g = ToFloat(dy[r * ch + c]);
      acc_w += g * (ToFloat(x[r * ch + c]) - mean[r]) * rstd[r];
      acc_b += g;
    }
  }
  shared_w[threadIdx.y][threadIdx.x] = acc_w;
  shared_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && c < ch) {
    float sum_w = 0.0f, sum_b = 0.0f;
    for (int i = 0; i < kRowLanes; ++i) {
      sum_w += shared_w[i][threadIdx.x];
      sum_b += shared_b[i][threadIdx.x];
    }
    partial_w[int64_t{blockIdx.y} * ch + c] = sum_w;
    partial_b[int64_t{blockIdx.y} * ch + c] = sum_b;
  }
}

// Pass 2: dweight[c] += sum of its chunk partials, in chunk order; dbias likewise.
template <typename T>
__global__ void LayerNormParamFinishKernel(const float* partial_w, const float* partial_b,
                                           int64_t chunks, int64_t ch, T* dweight, T* dbias) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < ch;
       c += int64_t{gridDim.x} * blockDim.x) {
    float sum_w = 0.0f, sum_b = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) {
      sum_w += partial_w[k * ch + c];
      sum_b += partial_b[k * ch + c];
    }
    dweight[c] = FromFloat<T>(ToFloat(dweight[c]) + sum_w);
    dbias[c] = FromFloat<T>(ToFloat(dbias[c]) + sum_b);
  }
}

struct LayerNormDims {
  int64_t rows, channels;
};

LayerNormDims CheckLayerNormArgs(Device device, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd, const char* op) {
  CheckFloat(x, device, op, "x");
  CheckOnDevice(weight, device, x.dtype(), op, "weight");
  ZTRAIN_CHECK(weight.dim() == 1, op, ": weight must be [C], got ",
               ShapeToString(weight.shape()));
  const int64_t ch = weight.size(0);
  const int64_t rows = RowsOf(x, ch, op, "x");
  CheckOnDevice(mean, device, DType::kF32, op, "mean");
  CheckCount(mean, rows, op, "mean");
  CheckOnDevice(rstd, device, DType::kF32, op, "rstd");
  CheckCount(rstd, rows, op, "rstd");
  return {rows, ch};
}

unsigned RowBlocks(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

void CudaOps::LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                               const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  constexpr const char* kOp = "LayerNormForward";
  const LayerNormDims d = CheckLayerNormArgs(device(), x, weight, mean, rstd, kOp);
  CheckLike(bias, weight, kOp, "bias");
  CheckLike(y, x, kOp, "y");
  ZTRAIN_CHECK(RowBlocks(d.rows) <= 0x7fffffffu, kOp, ": ", d.rows, " rows is too many");
  if (d.rows == 0) return;
  DispatchFloat(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    LayerNormForwardKernel<T><<<RowBlocks(d.rows), kThreads, 0, stream_>>>(
        x.data<const T>(), weight.data<const T>(), bias.data<const T>(), d.rows, d.channels,
        y.data<T>(), mean.data<float>(), rstd.data<float>());
    ZTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void CudaOps::LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                const Tensor& dweight, const Tensor& dbias) {
  constexpr const char* kOp = "LayerNormBackward";
  const LayerNormDims d = CheckLayerNormArgs(device(), x, weight, mean, rstd, kOp);
  CheckLike(dy, x, kOp, "dy");
  CheckLike(dx, x, kOp, "dx");
  CheckLike(dweight, weight, kOp, "dweight");
  CheckLike(dbias, weight, kOp, "dbias");
  const int64_t rows = d.rows, ch = d.channels;
  ZTRAIN_CHECK(RowBlocks(rows) <= 0x7fffffffu && (ch + kColTile - 1) / kColTile <= 0x7fffffff,
               kOp, ": x has shape ", ShapeToString(x.shape()), ", too large for one launch");
  if (rows == 0 || ch == 0) return;
  const int64_t chunks = Chunks(rows);
  const size_t partial_floats = static_cast<size_t>(chunks * ch);
  auto* partial_w = static_cast<float*>(Workspace(2 * sizeof(float) * partial_floats));
  float* partial_b = partial_w + partial_floats;
  DispatchFloat(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>((ch + kColTile - 1) / kColTile),
                    static_cast<unsigned>(chunks));
    LayerNormParamPartialKernel<T><<<grid, dim3(kColTile, kRowLanes), 0, stream_>>>(
        dy.data<const T>(), x.data<const T>(), mean.data<const float>(),
        rstd.data<const float>(), rows, ch, RowsPerChunk(rows), partial_w, partial_b);
    ZTRAIN_CUDA_CHECK_LAUNCH();
    LayerNormParamFinishKernel<T><<<GridFor(ch), kThreads, 0, stream_>>>(
        partial_w, partial_b, chunks, ch, dweight.data<T>(), dbias.data<T>());
    ZTRAIN_CUDA_CHECK_LAUNCH();
    // After the partials: dx may alias dy or x.
    LayerNormInputGradKernel<T><<<RowBlocks(rows), kThreads, 0, stream_>>>(
        dy.data<const T>(), x.data<const T>(), weight.data<const T>(), mean.data<const float>(),
        rstd.data<const float>(), rows, ch, dx.data<T>());
    ZTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ztrain::kernels::cuda
