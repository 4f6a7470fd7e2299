#pragma once
// The fp32 GEMM pieces shared by the linear layer's fp32 path (gemm.cc) and its mixed-dtype
// path (gemm_mixed.cc). Row-major throughout; each runs OpenMP-parallel or calls OpenBLAS
// and must not be called from inside a parallel region (Note [BLAS and OpenMP]).
#include <cstdint>

#include "kernels/gemm_plan.h"

namespace ztrain::kernels::cpu {

// c[m,n] = alpha * op(a) op(b) + beta * c with explicit leading dimensions; a dimension over
// the 32-bit BLAS interface throws naming `op`. OpenBLAS's SGEMM or oneDNN's fp32 matmul, as
// `plan` says for the shape or ZTRAIN_FP32_GEMM overrides (Note [fp32 GEMMs on oneDNN] in
// gemm.cc).
void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
           const char* op, const GemmPlan& plan);
// y[r, :] += bias for every row.
void AddBiasRows(float* y, const float* bias, int64_t rows, int64_t cols);
// dbias[c] += sum over rows of dy[r, c], in row order for every column (deterministic).
void AccumulateColumnSums(const float* dy, int64_t rows, int64_t cols, float* dbias);

}  // namespace ztrain::kernels::cpu
