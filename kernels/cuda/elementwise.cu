// Elementwise ops, GELU, SwiGLU and the sum of squares on the GPU. fp32 or bf16 tensors,
// fp32 arithmetic; SumSquares accumulates in double.
#include <algorithm>

#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"

namespace ztrain::kernels::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
// SumSquares: a fixed number of elements per first-pass block, so the partial sums, and the
// order they are added in, depend only on the size (the same bits on every GPU and run).
constexpr int64_t kSumPerBlock = int64_t{kThreads} * 16;
constexpr int64_t kMaxSumBlocks = 4096;

template <typename T>
__global__ void AddKernel(const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = FromFloat<T>(ToFloat(a[i]) + ToFloat(b[i]));
  }
}

template <typename T>
__global__ void ScaleKernel(T* t, float alpha, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    t[i] = FromFloat<T>(ToFloat(t[i]) * alpha);
  }
}

// sigmoid(2u) = 0.5 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3): the form
// kernels/cpu/gelu.cc uses, free of tanh's cancellation near -1.
__device__ __forceinline__ float HalfOnePlusTanh(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 1.0f / (1.0f + expf(-2.0f * u));
}

template <typename T>
__global__ void GeluForwardKernel(const T* x, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = ToFloat(x[i]);
    y[i] = FromFloat<T>(v * HalfOnePlusTanh(v));
  }
}

// gelu'(x) = s + x s (1 - s) 2 u'(x), s = sigmoid(2u).
template <typename T>
__global__ void GeluBackwardKernel(const T* dy, const T* x, T* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = ToFloat(x[i]);
    const float s = HalfOnePlusTanh(v);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
    dx[i] = FromFloat<T>(ToFloat(dy[i]) * (s + 2.0f * v * s * (1.0f - s) * du));
  }
}

// sigmoid(g) = 1 / (1 + e^-g) with the accurate expf; 0 (not NaN) where e^-g overflows.
__device__ __forceinline__ float Sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// h = silu(gate) * up, silu(g) = g sigmoid(g).
template <typename T>
__global__ void SwiGluForwardKernel(const T* gate, const T* up, T* h, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = ToFloat(gate[i]);
    h[i] = FromFloat<T>(g * Sigmoid(g) * ToFloat(up[i]));
  }
}

// dgate = dh * up * silu'(gate), silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g);
// dup = dh * silu(gate). Every input of element i is read before its outputs are written.
template <typename T>
__global__ void SwiGluBackwardKernel(const T* dh, const T* gate, const T* up, T* dgate, T* dup,
                                     int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = ToFloat(gate[i]), u = ToFloat(up[i]), d = ToFloat(dh[i]);
    const float s = Sigmoid(g);
    dgate[i] = FromFloat<T>(d * u * s * (1.0f + g * (1.0f - s)));
    dup[i] = FromFloat<T>(d * g * s);
  }
}

// First pass: block b sums the squares of chunks b, b + gridDim.x, ... of kSumPerBlock
// elements, each thread in a fixed stride order, then the block in a fixed tree.
template <typename T>
__global__ void SumSquaresPartialKernel(const T* t, int64_t n, double* partial) {
  __shared__ double shared[kThreads / 32];
  double acc = 0.0;
  for (int64_t base = blockIdx.x * kSumPerBlock; base < n;
       base += int64_t{gridDim.x} * kSumPerBlock) {
    const int64_t end = min(n, base + kSumPerBlock);
    for (int64_t i = base + threadIdx.x; i < end; i += kThreads) {
      const double v = ToFloat(t[i]);
      acc += v * v;
    }
  }
  acc = BlockSum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Second pass: one block adds the partials, each thread a fixed subset, then a fixed tree.
__global__ void SumPartialsKernel(const double* partial, int count, double* total) {
  __shared__ double shared[kThreads / 32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += kThreads) acc += partial[i];
  acc = BlockSum(acc, shared);
  if (threadIdx.x == 0) *total = acc;
}

// Launches the grid-stride kernel `kernel` (a template instantiated on T) over n elements.
template <typename Kernel, typename... Args>
void Launch1D(Kernel kernel, int64_t n, cudaStream_t stream, Args... args) {
  if (n == 0) return;
  kernel<<<GridFor(n), kThreads, 0, stream>>>(args..., n);
  ZTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaOps::Add(const Tensor& a, const Tensor& b, const Tensor& y) {
  CheckFloat(a, device(), "Add", "a");
  CheckLike(b, a, "Add", "b");
  CheckLike(y, a, "Add", "y");
  DispatchFloat(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Launch1D(AddKernel<T>, a.numel(), stream_, a.data<const T>(), b.data<const T>(),
             y.data<T>());
  });
}

void CudaOps::AddInPlace(const Tensor& y, const Tensor& x) {
  CheckFloat(y, device(), "AddInPlace", "y");
  CheckLike(x, y, "AddInPlace", "x");
  DispatchFloat(y.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Launch1D(AddKernel<T>, y.numel(), stream_, y.data<const T>(), x.data<const T>(),
             y.data<T>());
  });
}

// Zero and Copy move bytes, so they take every dtype.
void CudaOps::Zero(const Tensor& t) {
  CheckOnDevice(t, device(), "Zero", "t");
  if (t.nbytes() == 0) return;
  ZTRAIN_CUDA_CHECK(cudaMemsetAsync(t.data(), 0, t.nbytes(), stream_));
}

void CudaOps::Copy(const Tensor& src, const Tensor& dst) {
  // Each side is this device's memory or the host's (pinned or not: cudaMemcpyDefault lets
  // unified addressing tell them apart).
  CheckOnDevice(src, src.device().is_cpu() ? Device::Cpu() : device(), "Copy", "src");
  CheckOnDevice(dst, dst.device().is_cpu() ? Device::Cpu() : device(), src.dtype(), src.shape(),
                "Copy", "dst");
  if (src.nbytes() == 0 || src.data() == dst.data()) return;
  ZTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, stream_));
}

void CudaOps::Synchronize() { ZTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void CudaOps::Scale(const Tensor& t, float alpha) {
  CheckFloat(t, device(), "Scale", "t");
  DispatchFloat(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Launch1D(ScaleKernel<T>, t.numel(), stream_, t.data<T>(), alpha);
  });
}

void CudaOps::GeluForward(const Tensor& x, const Tensor& y) {
  CheckFloat(x, device(), "GeluForward", "x");
  CheckLike(y, x, "GeluForward", "y");
  DispatchFloat(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Launch1D(GeluForwardKernel<T>, x.numel(), stream_, x.data<const T>(), y.data<T>());
  });
}

void CudaOps::GeluBackward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  CheckFloat(x, device(), "GeluBackward", "x");
  CheckLike(dy, x, "GeluBackward", "dy");
  CheckLike(dx, x, "GeluBackward", "dx");
  DispatchFloat(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Launch1D(GeluBackwardKernel<T>, x.numel(), stream_, dy.data<const T>(), x.data<const T>(),
             dx.data<T>());
  });
}

void CudaOps::SwiGluForward(const Tensor& gate, const Tensor& up, const Tensor& h) {
  CheckFloat(gate, device(), "SwiGluForward", "gate");
  CheckLike(up, gate, "SwiGluForward", "up");
  CheckLike(h, gate, "SwiGluForward", "h");
  DispatchFloat(gate.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Launch1D(SwiGluForwardKernel<T>, gate.numel(), stream_, gate.data<const T>(),
             up.data<const T>(), h.data<T>());
  });
}

void CudaOps::SwiGluBackward(const Tensor& dh, const Tensor& gate, const Tensor& up,
                             const Tensor& dgate, const Tensor& dup) {
  CheckFloat(gate, device(), "SwiGluBackward", "gate");
  CheckLike(up, gate, "SwiGluBackward", "up");
  CheckLike(dh, gate, "SwiGluBackward", "dh");
  CheckLike(dgate, gate, "SwiGluBackward", "dgate");
  CheckLike(dup, gate, "SwiGluBackward", "dup");
  DispatchFloat(gate.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Launch1D(SwiGluBackwardKernel<T>, gate.numel(), stream_, dh.data<const T>(),
             gate.data<const T>(), up.data<const T>(), dgate.data<T>(), dup.data<T>());
  });
}

// Two passes with a fixed block count (a function of numel only), so the same tensor gives
// the same bits on every run and every GPU; then the scalar comes back and the stream is
// synchronised (the caller needs the value now: gradient clipping).
double CudaOps::SumSquares(const Tensor& t) {
  CheckFloat(t, device(), "SumSquares", "t");
  const int64_t n = t.numel();
  if (n == 0) return 0.0;
  const int blocks =
      static_cast<int>(std::min(kMaxSumBlocks, (n + kSumPerBlock - 1) / kSumPerBlock));
  auto* partial = static_cast<double*>(Workspace(sizeof(double) * (blocks + 1)));
  DispatchFloat(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    SumSquaresPartialKernel<T><<<blocks, kThreads, 0, stream_>>>(t.data<const T>(), n, partial);
    ZTRAIN_CUDA_CHECK_LAUNCH();
  });
  SumPartialsKernel<<<1, kThreads, 0, stream_>>>(partial, blocks, partial + blocks);
  ZTRAIN_CUDA_CHECK_LAUNCH();
  double total = 0.0;
  ZTRAIN_CUDA_CHECK(cudaMemcpyAsync(&total, partial + blocks, sizeof(double),
                                    cudaMemcpyDeviceToHost, stream_));
  ZTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return total;
}

}  // namespace ztrain::kernels::cuda
