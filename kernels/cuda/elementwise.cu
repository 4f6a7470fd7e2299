// Elementwise ops, GELU, SwiGLU, the sum of squares and Copy's dtype conversion on the GPU.
// fp32, bf16 or fp16 tensors (mixed: Note [Mixed dtypes on CUDA] in widen.h), fp32 arithmetic;
// SumSquares accumulates in double.
#include <algorithm>

#include "kernels/cpu/convert.h"

#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"
#include "kernels/cuda/widen.h"

namespace ztrain::kernels::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
// SumSquares: a fixed number of elements per first-pass block, so the partial sums, and the
// order they are added in, depend only on the size (the same bits on every GPU and run).
constexpr int64_t kSumPerBlock = int64_t{kThreads} * 16;
constexpr int64_t kMaxSumBlocks = 4096;
// Copy's conversions with a host side stage this many elements at a time (16 MiB of fp32).
constexpr int64_t kCopyChunk = int64_t{1} << 22;

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

// dst[i] = src[i] widened to fp32 (exact) and rounded to D, to nearest even.
template <typename S, typename D>
__global__ void ConvertKernel(const S* src, D* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = FromFloat<D>(ToFloat(src[i]));
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

// y[i] = sum[i] + (bias[row mod bias_rows] + residual[i]), rows of c; a null bias or
// residual adds 0.
template <typename T>
__global__ void AddBiasAndResidualKernel(const float* sum, const T* bias, int64_t bias_rows,
                                         const T* residual, int64_t c, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / c, col = i - row * c;
    const float b = bias != nullptr ? ToFloat(bias[(row % bias_rows) * c + col]) : 0.0f;
    const float r = residual != nullptr ? ToFloat(residual[i]) : 0.0f;
    y[i] = FromFloat<T>(sum[i] + (b + r));
  }
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
  if (NeedsWidening({a, b, y})) {  // Note [Mixed dtypes on CUDA]
    Widened w(*this);
    Add(w.In(a), w.In(b), w.Out(y));
    w.Commit();
    return;
  }
  CheckFloat(a, device(), "Add", "a");
  CheckLike(b, a, "Add", "b");
  CheckLike(y, a, "Add", "y");
  DispatchFloat(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Launch1D(AddKernel<T>, a.numel(), stream_, a.data<const T>(), b.data<const T>(),
             y.data<T>());
  });
}

// Native when bias, residual and y share a dtype (sum is fp32), else through the adapter.
void CudaOps::AddBiasAndResidual(const Tensor& sum, const Tensor& bias, const Tensor& residual,
                                 const Tensor& y) {
  constexpr const char* kOp = "AddBiasAndResidual";
  if (NeedsWidening({y, bias, residual})) {  // Note [Mixed dtypes on CUDA]
    Widened w(*this);
    AddBiasAndResidual(sum, w.In(bias), w.In(residual), w.Out(y));
    w.Commit();
    return;
  }
  CheckFloat(y, device(), kOp, "y");
  ZTRAIN_CHECK(y.dim() >= 1, kOp, ": y must be [N, C], got a scalar");
  const int64_t c = y.size(-1), rows = y.numel() / std::max<int64_t>(c, 1);
  CheckOnDevice(sum, device(), DType::kF32, kOp, "sum");
  CheckCount(sum, y.numel(), kOp, "sum");
  if (residual.defined()) {
    CheckOnDevice(residual, device(), y.dtype(), kOp, "residual");
    CheckCount(residual, y.numel(), kOp, "residual");
  }
  int64_t bias_rows = 1;
  if (bias.defined()) {
    CheckOnDevice(bias, device(), y.dtype(), kOp, "bias");
    bias_rows = RowsOf(bias, c, kOp, "bias");
    ZTRAIN_CHECK(bias_rows > 0 && rows % bias_rows == 0, kOp, ": bias ",
                 ShapeToString(bias.shape()), " has ", bias_rows, " rows, which do not divide the ",
                 rows, " rows of y ", ShapeToString(y.shape()));
  }
  DispatchFloat(y.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Launch1D(AddBiasAndResidualKernel<T>, y.numel(), stream_, sum.data<const float>(),
             bias.defined() ? bias.data<const T>() : nullptr, bias_rows,
             residual.defined() ? residual.data<const T>() : nullptr, c, y.data<T>());
  });
}

void CudaOps::AddInPlace(const Tensor& y, const Tensor& x) {
  if (NeedsWidening({y, x})) {
    Widened w(*this);
    AddInPlace(w.InOut(y), w.In(x));
    w.Commit();
    return;
  }
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
  constexpr const char* kOp = "Copy";
  // Each side is this device's memory or the host's (pinned or not: cudaMemcpyDefault lets
  // unified addressing tell them apart).
  const bool src_host = src.device().is_cpu(), dst_host = dst.device().is_cpu();
  CheckOnDevice(src, src_host ? Device::Cpu() : device(), kOp, "src");
  CheckOnDevice(dst, dst_host ? Device::Cpu() : device(), kOp, "dst");
  ZTRAIN_CHECK(dst.shape() == src.shape(), kOp, ": dst has shape ", ShapeToString(dst.shape()),
               ", expected ", ShapeToString(src.shape()), " (src's)");
  if (src.dtype() == dst.dtype()) {
    if (src.nbytes() == 0 || src.data() == dst.data()) return;
    ZTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, stream_));
    return;
  }
  ZTRAIN_CHECK(cpu::IsFloatType(src.dtype()) && cpu::IsFloatType(dst.dtype()), kOp,
               ": src has dtype ", DTypeName(src.dtype()), " and dst ", DTypeName(dst.dtype()),
               "; only fp32, bf16 and fp16 convert into each other");
  const auto* s0 = static_cast<const char*>(src.data());
  const auto* d0 = static_cast<const char*>(dst.data());
  ZTRAIN_CHECK(s0 + src.nbytes() <= d0 || d0 + dst.nbytes() <= s0, kOp,
               ": a conversion from ", DTypeName(src.dtype()), " to ", DTypeName(dst.dtype()),
               " needs src and dst apart; they overlap");
  const int64_t n = src.numel();
  if (n == 0) return;
  if (src_host && dst_host) {  // on the host, after the ops that may still write src
    Synchronize();
    cpu::ConvertFloat(src.data(), src.dtype(), dst.data(), dst.dtype(), n);
    return;
  }
  // The conversion runs on the device. A host side is staged through the workspace, a chunk
  // of kCopyChunk elements at a time, so the workspace stays small (a whole layer's fp32
  // master on the host, offloaded, converts into its 16-bit copy on the GPU); the stream
  // orders each chunk's copy after the previous chunk's conversion.
  const size_t src_size = DTypeSize(src.dtype()), dst_size = DTypeSize(dst.dtype());
  const int64_t chunk = src_host || dst_host ? std::min(n, kCopyChunk) : n;
  void* staged = src_host || dst_host
                     ? Workspace(static_cast<size_t>(chunk) * (src_host ? src_size : dst_size))
                     : nullptr;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t count = std::min(chunk, n - begin);
    const char* from = static_cast<const char*>(src.data()) + begin * src_size;
    char* to = static_cast<char*>(dst.data()) + begin * dst_size;
    if (src_host) {
      ZTRAIN_CUDA_CHECK(cudaMemcpyAsync(staged, from, count * src_size, cudaMemcpyHostToDevice,
                                        stream_));
      from = static_cast<const char*>(staged);
    }
    char* out = dst_host ? static_cast<char*>(staged) : to;
    DispatchFloat(src.dtype(), [&](auto s_tag) {
      DispatchFloat(dst.dtype(), [&](auto d_tag) {
        using S = typename decltype(s_tag)::type;
        using D = typename decltype(d_tag)::type;
        Launch1D(ConvertKernel<S, D>, count, stream_, reinterpret_cast<const S*>(from),
                 reinterpret_cast<D*>(out));
      });
    });
    if (dst_host) {
      ZTRAIN_CUDA_CHECK(
          cudaMemcpyAsync(to, staged, count * dst_size, cudaMemcpyDeviceToHost, stream_));
    }
  }
}

void CudaOps::Scale(const Tensor& t, float alpha) {
  CheckFloat(t, device(), "Scale", "t");
  DispatchFloat(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Launch1D(ScaleKernel<T>, t.numel(), stream_, t.data<T>(), alpha);
  });
}

void CudaOps::GeluForward(const Tensor& x, const Tensor& y) {
  if (NeedsWidening({x, y})) {
    Widened w(*this);
    GeluForward(w.In(x), w.Out(y));
    w.Commit();
    return;
  }
  CheckFloat(x, device(), "GeluForward", "x");
  CheckLike(y, x, "GeluForward", "y");
  DispatchFloat(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Launch1D(GeluForwardKernel<T>, x.numel(), stream_, x.data<const T>(), y.data<T>());
  });
}

void CudaOps::GeluBackward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  if (NeedsWidening({dy, x, dx})) {
    Widened w(*this);
    GeluBackward(w.In(dy), w.In(x), w.Out(dx));
    w.Commit();
    return;
  }
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
  if (NeedsWidening({gate, up, h})) {
    Widened w(*this);
    SwiGluForward(w.In(gate), w.In(up), w.Out(h));
    w.Commit();
    return;
  }
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
  if (NeedsWidening({dh, gate, up, dgate, dup})) {
    Widened w(*this);
    SwiGluBackward(w.In(dh), w.In(gate), w.In(up), w.Out(dgate), w.Out(dup));
    w.Commit();
    return;
  }
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
