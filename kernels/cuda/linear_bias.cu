// Column sums for the bias gradient, deterministic: pass 1 sums fixed chunks of rows per
// column tile into a float scratch (each chunk in a fixed order), pass 2 adds a column's
// chunk partials in chunk order and accumulates into dbias. The chunking depends only on
// the shape, so the bits do not change between runs or GPUs.
#include "kernels/cuda/linear_bias.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernel_utils.cuh"

namespace ztrain::kernels::cuda {
namespace {

constexpr int kColTile = 32;   // columns per block: one warp reads 32 consecutive values
constexpr int kRowLanes = 8;   // warps per block, each taking every 8th row of the chunk
constexpr int64_t kMinRowsPerChunk = 256;
constexpr int64_t kMaxChunks = 65535;  // gridDim.y limit

int64_t RowsPerChunk(int64_t rows) {
  return std::max(kMinRowsPerChunk, (rows + kMaxChunks - 1) / kMaxChunks);
}
int64_t Chunks(int64_t rows) { return (rows + RowsPerChunk(rows) - 1) / RowsPerChunk(rows); }

template <typename T>
__global__ void ColumnSumPartialKernel(const T* dy, int64_t rows, int64_t cols,
                                       int64_t rows_per_chunk, float* partial) {
  __shared__ float shared[kRowLanes][kColTile + 1];
  const int64_t c = int64_t{blockIdx.x} * kColTile + threadIdx.x;
  const int64_t r0 = int64_t{blockIdx.y} * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc = 0.0f;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) acc += ToFloat(dy[r * cols + c]);
  }
  shared[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float sum = 0.0f;
    for (int i = 0; i < kRowLanes; ++i) sum += shared[i][threadIdx.x];
    partial[int64_t{blockIdx.y} * cols + c] = sum;
  }
}

template <typename G>
__global__ void ColumnSumFinishKernel(const float* partial, int64_t chunks, int64_t cols,
                                      G* dbias) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cols;
       c += int64_t{gridDim.x} * blockDim.x) {
    float sum = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) sum += partial[k * cols + c];
    dbias[c] = FromFloat<G>(ToFloat(dbias[c]) + sum);
  }
}

template <typename T>
__global__ void BroadcastRowsKernel(const T* bias, int64_t cols, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = bias[i % cols];
  }
}

}  // namespace

size_t ColumnSumsScratchBytes(int64_t rows, int64_t cols) {
  return sizeof(float) * static_cast<size_t>(Chunks(rows) * cols);
}

void AccumulateColumnSums(const Tensor& dy, int64_t rows, int64_t cols, const Tensor& dbias,
                          void* scratch, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t chunks = Chunks(rows);
  const int64_t tiles = (cols + kColTile - 1) / kColTile;
  ZTRAIN_ASSERT(tiles <= 0x7fffffff, "AccumulateColumnSums: ", cols, " columns");
  auto* partial = static_cast<float*>(scratch);
  DispatchFloat(dy.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
    ColumnSumPartialKernel<T><<<grid, dim3(kColTile, kRowLanes), 0, stream>>>(
        dy.data<const T>(), rows, cols, RowsPerChunk(rows), partial);
    ZTRAIN_CUDA_CHECK_LAUNCH();
    DispatchGrad<T>(dbias.dtype(), [&](auto grad_tag) {
      using G = typename decltype(grad_tag)::type;
      ColumnSumFinishKernel<G><<<GridFor(cols), kThreads, 0, stream>>>(partial, chunks, cols,
                                                                      dbias.data<G>());
      ZTRAIN_CUDA_CHECK_LAUNCH();
    });
  });
}

void BroadcastRows(const Tensor& bias, int64_t rows, int64_t cols, const Tensor& y,
                   cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  DispatchFloat(y.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    BroadcastRowsKernel<T><<<GridFor(n), kThreads, 0, stream>>>(bias.data<const T>(), cols,
                                                                y.data<T>(), n);
    ZTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ztrain::kernels::cuda
