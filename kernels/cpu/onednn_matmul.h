#pragma once
// bf16 matmuls through oneDNN's matmul primitive (Note [bf16 GEMMs] in gemm_mixed.cc).
//
// OneDnnMatmul owns a oneDNN CPU engine and stream and a small cache of matmul primitives
// keyed by everything a primitive is specialised on (shape, transposes, leading dimensions,
// output dtype, bias, alpha, beta): creating one costs far more than a small GEMM. The cache
// is cleared when it reaches kMaxPrimitives entries. Not thread safe: one thread at a time,
// as the CpuOps that owns it. A oneDNN failure throws ztrain::Error naming the shape. Without
// oneDNN in the build (ZTRAIN_WITH_ONEDNN) OneDnnBf16Support() says so and no OneDnnMatmul
// can be made.
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace ztrain::kernels::cpu {

// Whether oneDNN runs bf16 matmuls on this process's machine, probed once per process: the
// build must have oneDNN, oneDNN must find AVX512-BF16 or AMX-BF16 on the CPU (it emulates
// bf16 on older CPUs, slower than SGEMM), and ZTRAIN_ONEDNN must not be 0.
struct OneDnnSupport {
  bool available = false;
  std::string detail;  // "oneDNN 2.6.3 on AVX512-BF16", or why it is unavailable
};
const OneDnnSupport& OneDnnBf16Support();
// Whether this build has oneDNN at all (whatever the CPU and the environment say).
bool OneDnnBuiltIn();
// "oneDNN 2.6.3": the library this process runs; empty without oneDNN in the build.
std::string OneDnnVersion();

// c[m,n] = alpha op(a) op(b) + bias + beta c, row-major with leading dimensions, op(x) = x^T
// when its flag is set: a is [m,k] ([k,m] when trans_a), b is [k,n] ([n,k] when trans_b).
struct MatmulArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  DType ab_type = DType::kBF16;  // a's and b's: bf16, or fp32 (oneDNN's fp32 matmul)
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  const float* bias = nullptr;  // fp32 [n], added to every row; null for none
  float beta = 0.0f;
  void* c = nullptr;  // fp32 or bf16 (c_type)
  DType c_type = DType::kF32;
  int64_t ldc = 0;
};

class OneDnnMatmul {
 public:
  static constexpr size_t kMaxPrimitives = 256;

  // Throws ztrain::Error when the build has no oneDNN.
  OneDnnMatmul();
  ~OneDnnMatmul();
  OneDnnMatmul(const OneDnnMatmul&) = delete;
  OneDnnMatmul& operator=(const OneDnnMatmul&) = delete;

  // Runs the matmul (m, n, k > 0) and returns true; false, having touched nothing, when
  // oneDNN has no implementation for this combination (the caller then uses SGEMM).
  bool Run(const MatmulArgs& args);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ztrain::kernels::cpu
