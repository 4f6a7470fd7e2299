#pragma once
// Device helpers shared by the kernels in kernels/cuda/*.cu (private to the backend):
// fp32/bf16/fp16 loads and stores (arithmetic is always fp32), warp and
// block reductions whose summation order is fixed (so results are bitwise reproducible),
// launch sizing, and the host-side dtype dispatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"

namespace ztrain::kernels::cuda {

inline constexpr int kThreads = 256;        // threads per block of the 1-D kernels
inline constexpr int64_t kMaxBlocks = 8192;  // grid-stride loops cover the rest

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}

// Butterfly sum over the 32 lanes; every lane gets the same, order-fixed result.
template <typename Acc>
__device__ __forceinline__ Acc WarpSum(Acc v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over a block of kThreads threads; the result is valid in thread 0. `shared` holds
// kThreads / 32 values; every thread of the block must call it. The order is fixed by the thread layout, not by scheduling.
template <typename Acc>
__device__ __forceinline__ Acc BlockSum(Acc v, Acc* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpSum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  Acc total = 0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreads / 32; ++w) total += shared[w];
  }
  __syncthreads();  // `shared` may be reused right after
  return total;
}

// Blocks for a grid-stride loop over n elements.
inline unsigned GridFor(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxBlocks));
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<float>{}), fn(TypeTag<__nv_bfloat16>{}) or fn(TypeTag<__half>{}) for an
// fp32, bf16 or fp16 tensor (the dtype was checked before; anything else is an internal error).
template <typename Fn>
void DispatchFloat(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      fn(TypeTag<float>{});
      return;
    case DType::kBF16:
      fn(TypeTag<__nv_bfloat16>{});
      return;
    case DType::kF16:
      fn(TypeTag<__half>{});
      return;
    default:
      ZTRAIN_ASSERT(false, "DispatchFloat: dtype ", DTypeName(dtype), " was not checked");
  }
}

// The type of an op's accumulated parameter gradients over inputs of type T (Note [Mixed
// dtypes on CUDA], widen.h): fn(TypeTag<T>{}), or fn(TypeTag<float>{}) when `grad` is fp32
// (16-bit activations and weights with fp32 gradients, mixed precision's default).
template <typename T, typename Fn>
void DispatchGrad(DType grad, Fn&& fn) {
  if (grad == DType::kF32) {
    fn(TypeTag<float>{});
  } else {
    fn(TypeTag<T>{});
  }
}

}  // namespace ztrain::kernels::cuda
