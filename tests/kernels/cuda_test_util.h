#pragma once
// Device buffers for the cross-backend test (cuda_ops_test.cc): host vectors copied to the
// GPU as fp32, bf16 or int32 tensors and back as fp32, through plain cudaMalloc/cudaMemcpy.
//
// CudaOps enqueue on their own stream (a blocking one, kernels/cuda/cuda_ops.h); every copy
// in either direction still synchronises the whole device first and after, so a test never
// reads a half-written result whatever stream the ops used.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace ztrain::kernels::testing {

inline void CudaOk(cudaError_t err, const char* what) {
  ASSERT_EQ(err, cudaSuccess) << what << ": " << cudaGetErrorString(err);
}

// v with every element rounded to what `dtype` holds (bf16, fp16: to nearest even; fp32: as
// is), so that the CPU backend computes in fp32 on exactly the values the GPU sees.
inline std::vector<float> RoundTo(DType dtype, std::vector<float> v) {
  if (dtype == DType::kBF16) {
    for (float& x : v) x = Bf16ToFloat(FloatToBf16(x));
  } else if (dtype == DType::kF16) {
    for (float& x : v) x = HalfToFloat(FloatToHalf(x));
  }
  return v;
}

// The cross-backend tolerance of an output of `dtype` (ExpectClose: relative to |want| +
// rms(want)): one rounding to the dtype and fp32 differences of summation order and exp
// beside it (cuda_ops_test.cc, top).
inline double CrossBackendTolerance(DType dtype) {
  return dtype == DType::kBF16 ? 1e-2 : dtype == DType::kF16 ? 2e-3 : 1e-4;
}

// A device copy of a host vector, owning its cudaMalloc'd memory. Move-only.
class DeviceTensor {
 public:
  // Floats stored as `dtype` (kF32, kBF16 or kF16; 16-bit rounds to nearest even).
  DeviceTensor(const std::vector<float>& host, Shape shape, DType dtype, int device = 0) {
    std::vector<uint8_t> bytes(host.size() * DTypeSize(dtype));
    if (dtype == DType::kF32) {
      std::memcpy(bytes.data(), host.data(), bytes.size());
    } else {
      auto* h = reinterpret_cast<uint16_t*>(bytes.data());
      for (size_t i = 0; i < host.size(); ++i) {
        h[i] = dtype == DType::kF16 ? FloatToHalf(host[i]) : FloatToBf16(host[i]);
      }
    }
    Init(bytes, std::move(shape), dtype, device);
  }
  DeviceTensor(const std::vector<int32_t>& host, Shape shape, int device = 0) {
    std::vector<uint8_t> bytes(host.size() * sizeof(int32_t));
    std::memcpy(bytes.data(), host.data(), bytes.size());
    Init(bytes, std::move(shape), DType::kI32, device);
  }
  // Raw bytes of any dtype (fp16, say, which the float constructor does not take).
  DeviceTensor(const std::vector<uint8_t>& bytes, Shape shape, DType dtype, int device = 0) {
    EXPECT_EQ(bytes.size(), NumElements(shape) * DTypeSize(dtype));
    Init(bytes, std::move(shape), dtype, device);
  }
  // Uninitialised in the sense of the op contract: every byte 0xff (NaN as fp32 and bf16),
  // so an output the op forgets to write shows up.
  DeviceTensor(Shape shape, DType dtype, int device = 0) {
    // The size is taken before `shape` is moved into Init: the order in which a call's
    // arguments are initialised is unspecified, and g++ moved the shape out first (a 4-byte
    // allocation behind a full-size tensor, which the first run on a GPU found).
    const size_t nbytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
    Init(std::vector<uint8_t>(nbytes, 0xff), std::move(shape), dtype, device);
  }
  ~DeviceTensor() {
    if (ptr_) cudaFree(ptr_);  // errors ignored: a destructor must not throw
  }
  DeviceTensor(DeviceTensor&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), t_(o.t_) {}
  DeviceTensor& operator=(DeviceTensor&&) = delete;
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  const Tensor& tensor() const { return t_; }
  operator const Tensor&() const { return t_; }  // NOLINT: pass straight to the ops

  // The raw bytes, after every queued kernel has finished.
  std::vector<uint8_t> Bytes() const {
    std::vector<uint8_t> bytes(t_.nbytes());
    CudaOk(cudaDeviceSynchronize(), "cudaDeviceSynchronize before a download");
    if (!bytes.empty()) {
      CudaOk(cudaMemcpy(bytes.data(), ptr_, bytes.size(), cudaMemcpyDeviceToHost),
             "cudaMemcpy device to host");
    }
    return bytes;
  }
  // The values as fp32 (fp32, bf16 or fp16 tensors).
  std::vector<float> ToHost() const {
    const std::vector<uint8_t> bytes = Bytes();
    std::vector<float> out(t_.numel());
    if (t_.dtype() == DType::kF32) {
      std::memcpy(out.data(), bytes.data(), bytes.size());
    } else {
      const auto* h = reinterpret_cast<const uint16_t*>(bytes.data());
      for (size_t i = 0; i < out.size(); ++i) {
        out[i] = t_.dtype() == DType::kF16 ? HalfToFloat(h[i]) : Bf16ToFloat(h[i]);
      }
    }
    return out;
  }

 private:
  void Init(const std::vector<uint8_t>& bytes, Shape shape, DType dtype, int device) {
    ASSERT_EQ(bytes.size(), static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype))
        << "a device tensor's bytes must fill its shape " << ShapeToString(shape);
    CudaOk(cudaSetDevice(device), "cudaSetDevice");
    if (!bytes.empty()) {
      CudaOk(cudaMalloc(&ptr_, bytes.size()), "cudaMalloc");
      CudaOk(cudaMemcpy(ptr_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
             "cudaMemcpy host to device");
      CudaOk(cudaDeviceSynchronize(), "cudaDeviceSynchronize after an upload");
    }
    t_ = Tensor(ptr_, dtype, std::move(shape), Device::Cuda(device));
  }

  void* ptr_ = nullptr;
  Tensor t_;
};

// The fixture of the cross-backend tests, parameterised by the dtype under test: a CPU and a
// CUDA backend (every test skips without a GPU), and random inputs the dtype holds exactly.
class CrossBackendTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device visible: the CUDA backend is compared with the CPU one "
                      "only on a machine with a GPU";
    }
    cpu_ = MakeCpuOps();
    gpu_ = MakeCudaOps(0);
  }

  DType dtype() const { return GetParam(); }
  double Tol() const { return CrossBackendTolerance(dtype()); }
  // Random values in [lo, hi) that the tested dtype holds exactly.
  std::vector<float> Rand(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) const {
    return RoundTo(dtype(), Random(n, seed, lo, hi));
  }
  // Device copies of host values in the tested dtype or fp32, and NaN-filled outputs.
  DeviceTensor Dev(const std::vector<float>& v, Shape shape) const {
    return DeviceTensor(v, std::move(shape), dtype());
  }
  DeviceTensor DevF32(const std::vector<float>& v, Shape shape) const {
    return DeviceTensor(v, std::move(shape), DType::kF32);
  }
  DeviceTensor Out(Shape shape) const { return DeviceTensor(std::move(shape), dtype()); }
  DeviceTensor OutF32(Shape shape) const { return DeviceTensor(std::move(shape), DType::kF32); }
  // The GPU result against the CPU one, at the dtype's tolerance unless `tol` is given.
  void Expect(const DeviceTensor& got, const std::vector<float>& want, const std::string& what,
              double tol = 0.0) const {
    ExpectClose(got.ToHost(), ToDouble(want), tol > 0.0 ? tol : Tol(), what);
  }

  std::unique_ptr<Ops> cpu_, gpu_;
};

inline std::string DTypeParamName(const ::testing::TestParamInfo<DType>& info) {
  return std::string(DTypeName(info.param));
}

}  // namespace ztrain::kernels::testing
