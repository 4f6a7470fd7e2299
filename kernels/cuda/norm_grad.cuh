#pragma once
// What layernorm.cu and rmsnorm.cu share (private to the backend): one warp per row for the
// row kernels, the checks of x [..., C] against weight [C] and of a per-row fp32 statistic,
// and the deterministic parameter-gradient column sums.
//
// Note [Norm parameter gradients]: out_k[c] += sum over rows r of term_k(r, c) (k < K: dweight,
// and LayerNorm's dbias) without floating-point atomics, so the bits depend on the shapes
// only. Pass 1 (NormParamPartialKernel): block (32-column tile, row chunk) sums the terms
// over the chunk's rows, row lane y taking every 8th row, then adds the 8 lanes in order,
// into partial[k][chunk][c] in the ops' workspace. Pass 2 (NormParamFinishKernel) adds a
// column's partials in chunk order into out_k[c]. Both passes only read dy and x, so a dx
// kernel enqueued after them may overwrite either.
#include <algorithm>
#include <array>
#include <cstdint>

#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"

namespace ztrain::kernels::cuda {

inline constexpr int kNormRowsPerBlock = kThreads / 32;  // row kernels: one warp per row
inline constexpr int kNormColTile = 32;  // parameter-gradient block: 32 channels ...
inline constexpr int kNormRowLanes = 8;  // ... by 8 row lanes
inline constexpr int64_t kNormMinRowsPerChunk = 64;
inline constexpr int64_t kNormMaxChunks = 65535;  // gridDim.y limit

inline int64_t NormRowsPerChunk(int64_t rows) {
  return std::max(kNormMinRowsPerChunk, (rows + kNormMaxChunks - 1) / kNormMaxChunks);
}
inline int64_t NormChunks(int64_t rows) {
  return (rows + NormRowsPerChunk(rows) - 1) / NormRowsPerChunk(rows);
}
inline unsigned NormRowBlocks(int64_t rows) {
  return static_cast<unsigned>((rows + kNormRowsPerBlock - 1) / kNormRowsPerBlock);
}

struct NormDims {
  int64_t rows, channels;
};

// x (fp32, bf16 or fp16) is [..., C] for weight [C] of x's dtype; returns rows and C.
inline NormDims CheckNormArgs(Device device, const Tensor& x, const Tensor& weight,
                              const char* op) {
  CheckFloat(x, device, op, "x");
  CheckOnDevice(weight, device, x.dtype(), op, "weight");
  ZTRAIN_CHECK(weight.dim() == 1, op, ": weight must be [C], got ",
               ShapeToString(weight.shape()));
  const int64_t ch = weight.size(0);
  ZTRAIN_CHECK(x.dim() >= 1 && x.size(-1) == ch, op, ": x has shape ", ShapeToString(x.shape()),
               " and weight ", ShapeToString(weight.shape()),
               "; x must be [..., C] for weight [C]");
  return {x.numel() / std::max<int64_t>(ch, 1), ch};
}
// stat (a per-row statistic: mean, rstd) is fp32 with one element per row, any shape.
inline void CheckRowStat(Device device, const Tensor& stat, const NormDims& d, const char* op,
                         const char* what) {
  CheckOnDevice(stat, device, DType::kF32, op, what);
  CheckCount(stat, d.rows, op, what);
}
// The grid limits of the row kernels and the parameter-gradient passes.
inline void CheckNormLaunch(const Tensor& x, const NormDims& d, const char* op) {
  ZTRAIN_CHECK(NormRowBlocks(d.rows) <= 0x7fffffffu &&
                   (d.channels + kNormColTile - 1) / kNormColTile <= 0x7fffffff,
               op, ": x has shape ", ShapeToString(x.shape()), ", too large for one launch");
}

// Pass 1 (Note [Norm parameter gradients]). Term: a device functor, term(r, c, v) sets v[k]
// to term_k(r, c).
template <int K, typename Term>
__global__ void NormParamPartialKernel(Term term, int64_t rows, int64_t ch,
                                       int64_t rows_per_chunk, float* partial) {
  __shared__ float shared[K][kNormRowLanes][kNormColTile + 1];
  const int64_t c = int64_t{blockIdx.x} * kNormColTile + threadIdx.x;
  const int64_t r0 = int64_t{blockIdx.y} * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc[K] = {};
  if (c < ch) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kNormRowLanes) {
      float v[K];
      term(r, c, v);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) shared[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < ch) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float sum = 0.0f;
      for (int i = 0; i < kNormRowLanes; ++i) sum += shared[k][i][threadIdx.x];
      partial[(int64_t{k} * gridDim.y + blockIdx.y) * ch + c] = sum;
    }
  }
}

// Pass 2: out[k][c] += the sum of its chunk partials, in chunk order; a null out[k] (a
// frozen parameter's gradient, Note [Frozen parameters] in ops.h) is skipped.
template <int K, typename T>
__global__ void NormParamFinishKernel(const float* partial, int64_t chunks, int64_t ch,
                                      std::array<T*, K> out) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < ch;
       c += int64_t{gridDim.x} * blockDim.x) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (out[k] == nullptr) continue;
      float sum = 0.0f;
      for (int64_t j = 0; j < chunks; ++j) sum += partial[(k * chunks + j) * ch + c];
      out[k][c] = FromFloat<T>(ToFloat(out[k][c]) + sum);
    }
  }
}

// Enqueues both passes on ops' stream, the partials in ops' workspace (rows, ch > 0); nothing
// when every out[k] is null. Pass 1 is the same whichever are null, so each defined out[k]
// gets the same bits.
template <int K, typename T, typename Term>
void AccumulateNormParamGrads(CudaOps& ops, const Term& term, const NormDims& d,
                              std::array<T*, K> out) {
  if (std::all_of(out.begin(), out.end(), [](T* p) { return p == nullptr; })) return;
  const int64_t chunks = NormChunks(d.rows);
  auto* partial = static_cast<float*>(
      ops.Workspace(sizeof(float) * static_cast<size_t>(K * chunks * d.channels)));
  const dim3 grid(static_cast<unsigned>((d.channels + kNormColTile - 1) / kNormColTile),
                  static_cast<unsigned>(chunks));
  NormParamPartialKernel<K><<<grid, dim3(kNormColTile, kNormRowLanes), 0, ops.stream()>>>(
      term, d.rows, d.channels, NormRowsPerChunk(d.rows), partial);
  ZTRAIN_CUDA_CHECK_LAUNCH();
  NormParamFinishKernel<K, T><<<GridFor(d.channels), kThreads, 0, ops.stream()>>>(
      partial, chunks, d.channels, out);
  ZTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace ztrain::kernels::cuda
