// CudaOps::Dequantize (ops.h; the blob is kernels/quant.h's): grid-stride loops, one thread per
// packed byte of 4-bit codes (its two values) or per INT8 element. Every product and sum is an
// explicit __fmul_rn / __fadd_rn, which nvcc never contracts into a fused multiply-add, so the
// values are bitsandbytes' separately rounded ones and the CPU backend's bit for bit. The code
// tables travel by value with the launch and are staged in shared memory.
#include <algorithm>
#include <array>
#include <cstdint>

#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"

namespace ztrain::kernels::cuda {
namespace {

struct QuantTables {
  float codebook[16];  // the 4-bit codes' values
  float map[256];      // double quantization's 8-bit codes' values
};

// The 4-bit sections of a blob (QuantLayout), as device pointers.
struct Blob4Bit {
  const uint8_t* codes;
  const float* absmax;          // one per block, without double quantization
  const uint8_t* absmax_codes;  // with it: one per block,
  const float* scales;          // one per 256 whole blocks, then the offset
  int64_t n_scales;
};

template <typename T>
__global__ void Dequantize4BitKernel(Blob4Bit blob, QuantTables tables, QuantGeometry g,
                                     bool double_quant, int64_t n, T* out) {
  __shared__ float codebook[16];
  __shared__ float map[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    map[i] = tables.map[i];
    if (i < 16) codebook[i] = tables.codebook[i];
  }
  __syncthreads();
  const int64_t pairs = (n + 1) / 2;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < pairs;
       j += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = 2 * j / kQuantBlock;
    float absmax;
    if (double_quant) {
      const float scale = blob.scales[g.WholeBlock(b) / kDoubleQuantBlock];
      absmax = __fadd_rn(__fmul_rn(map[blob.absmax_codes[b]], scale), blob.scales[blob.n_scales]);
    } else {
      absmax = blob.absmax[b];
    }
    const uint8_t byte = blob.codes[j];  // the first of the pair in the high nibble
    out[2 * j] = FromFloat<T>(__fmul_rn(codebook[byte >> 4], absmax));
    if (2 * j + 1 < n) out[2 * j + 1] = FromFloat<T>(__fmul_rn(codebook[byte & 0x0f], absmax));
  }
}

// x' = (code * row_absmax) * fp32(1/127).
template <typename T>
__global__ void DequantizeInt8Kernel(const int8_t* codes, const float* absmax, int64_t cols,
                                     int64_t n, T* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float scaled = __fmul_rn(static_cast<float>(codes[i]), absmax[i / cols]);
    out[i] = FromFloat<T>(__fmul_rn(scaled, kInt8DequantScale));
  }
}

QuantTables TablesOf(QuantType type) {
  QuantTables t;
  const std::array<float, 16>& codebook = Codebook(type);
  std::copy(codebook.begin(), codebook.end(), t.codebook);
  std::copy(DynamicMap().begin(), DynamicMap().end(), t.map);
  return t;
}

}  // namespace

void CudaOps::Dequantize(const Tensor& blob, const QuantFormat& format,
                         const QuantGeometry& geometry, const Tensor& out) {
  constexpr const char* kOp = "Dequantize";
  CheckQuant(format, geometry, kOp);
  const QuantLayout layout = LayoutOf(format, geometry);
  CheckOnDevice(blob, device(), DType::kU8, kOp, "blob");
  CheckCount(blob, layout.total, kOp, "blob");
  ZTRAIN_CHECK(reinterpret_cast<uintptr_t>(blob.data()) % 4 == 0, kOp,
               ": blob's data is not 4-byte aligned; its fp32 sections are read as floats");
  CheckFloat(out, device(), kOp, "out");
  ZTRAIN_CHECK(out.shape() == Shape({geometry.rows, geometry.cols}), kOp, ": out has shape ",
               ShapeToString(out.shape()), ", expected [", geometry.rows, ", ", geometry.cols,
               "]");
  const auto* bytes = static_cast<const uint8_t*>(blob.data());
  const int64_t n = geometry.rows * geometry.cols;
  DispatchFloat(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (format.type == QuantType::kInt8) {
      DequantizeInt8Kernel<T><<<GridFor(n), kThreads, 0, stream_>>>(
          reinterpret_cast<const int8_t*>(bytes + layout.codes),
          reinterpret_cast<const float*>(bytes + layout.absmax), geometry.cols, n, out.data<T>());
    } else {
      const Blob4Bit sections{bytes + layout.codes,
                              reinterpret_cast<const float*>(bytes + layout.absmax),
                              bytes + layout.absmax_codes,
                              reinterpret_cast<const float*>(bytes + layout.scales),
                              layout.scales_bytes / 4 - 1};
      Dequantize4BitKernel<T><<<GridFor((n + 1) / 2), kThreads, 0, stream_>>>(
          sections, TablesOf(format.type), geometry, format.double_quant, n, out.data<T>());
    }
    ZTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ztrain::kernels::cuda
