#pragma once
// GEMM rates on this CPU, measured: OpenBLAS's SGEMM and oneDNN's fp32 and bf16 matmuls on one
// shape, for the choices that depend on them (Note [bf16 where it pays], bf16_speed.h) and for
// `ztrain tune --gemm`, which prints them for a model's shapes.
#include <cstdint>

#include "kernels/gemm_plan.h"

namespace ztrain::kernels {

// GFLOP/s of C[m,n] = A[m,k] B[k,n] with an fp32 C, best of the repetitions after a warm-up;
// 0 for a backend not timed (not asked for, or oneDNN is not in the build or has no such
// matmul). bf16 times bf16 A and B (converted once, outside the timing).
struct GemmRates {
  double sgemm = 0.0;        // OpenBLAS cblas_sgemm
  double onednn_fp32 = 0.0;  // oneDNN's fp32 matmul primitive
  double onednn_bf16 = 0.0;  // oneDNN's bf16 matmul primitive
};

struct GemmBackends {
  bool onednn_fp32 = false;
  bool onednn_bf16 = false;
};

// On this process's OpenMP threads; a few times 2mnk FLOPs of work per backend. `shape`'s
// transposes are those of the operands as stored (a is [k,m] when trans_a, b [n,k] when
// trans_b), as the step's GEMMs have them.
GemmRates TimeGemm(const GemmShape& shape, GemmBackends backends, int reps = 5);

}  // namespace ztrain::kernels
