// Gemm and the linear layer: the GEMMs go to OpenBLAS or oneDNN (Note [fp32 GEMMs on oneDNN]),
// the bias add and the bias gradient are OpenMP loops run between the GEMM calls (Note [BLAS
// and OpenMP] in cpu_ops.h). Calls with a 16-bit argument go to gemm_mixed.cc (Note [bf16
// GEMMs]).
#include <cblas.h>

#include <algorithm>
#include <climits>

#include "kernels/cpu/check.h"
#include "kernels/cpu/column_sums.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_choice.h"
#include "kernels/cpu/gemm_util.h"
#include "kernels/cpu/onednn_matmul.h"

namespace ztrain::kernels {
namespace cpu {
namespace {

int BlasDim(int64_t d, const char* op, const char* what) {
  ZTRAIN_CHECK(d <= INT_MAX, op, ": ", what, " = ", d, " exceeds the 32-bit BLAS interface");
  return static_cast<int>(d);
}

// Note [fp32 GEMMs on oneDNN]: an fp32 GEMM runs on OpenBLAS's SGEMM or on oneDNN's fp32
// matmul as the plan the engine gave says for its shape (Note [GEMMs chosen by measurement] in
// gemm_choice.h; OpenBLAS for a shape the plan does not hold, or when this build has no
// oneDNN). ZTRAIN_FP32_GEMM overrides the plan for the process (Fp32GemmByEnvironment):
// "auto" (the default: the plan), "openblas" or "onednn" (every shape; a shape oneDNN does
// not implement falls back to SGEMM). Read at every call, so that a test can switch it; each
// thread keeps its own primitive cache.
bool Fp32GemmOnOneDnn(const GemmPlan& plan, const GemmShape& shape) {
  switch (Fp32GemmByEnvironment()) {
    case Fp32GemmChoice::kOpenBlas:
      return false;
    case Fp32GemmChoice::kAuto:
      return plan.For(shape) == GemmBackend::kOneDnn && OneDnnBuiltIn();
    case Fp32GemmChoice::kOneDnn:
      ZTRAIN_CHECK(OneDnnBuiltIn(),
                   "ZTRAIN_FP32_GEMM=onednn, but this build has no oneDNN "
                   "(install libdnnl-dev and reconfigure)");
      return true;
  }
  return false;
}

bool OneDnnSgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  thread_local OneDnnMatmul matmul;
  MatmulArgs args;
  args.trans_a = trans_a, args.trans_b = trans_b;
  args.m = m, args.n = n, args.k = k;
  args.alpha = alpha, args.beta = beta;
  args.ab_type = DType::kF32;
  args.a = a, args.lda = lda, args.b = b, args.ldb = ldb;
  args.c = c, args.c_type = DType::kF32, args.ldc = ldc;
  return matmul.Run(args);
}

}  // namespace

void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
           const char* op, const GemmPlan& plan) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS rejects lda = 0; the product is empty, only beta * c remains
    for (int64_t i = 0; i < m * n; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return;
  }
  if (Fp32GemmOnOneDnn(plan, {trans_a, trans_b, m, n, k}) &&
      OneDnnSgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) {
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, BlasDim(m, op, "M"), BlasDim(n, op, "N"),
              BlasDim(k, op, "K"), alpha, a, BlasDim(lda, op, "lda"), b,
              BlasDim(ldb, op, "ldb"), beta, c, BlasDim(ldc, op, "ldc"));
}

void AddBiasRows(float* y, const float* bias, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= cpu::kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) yr[c] += bias[c];
  }
}

// Note [Deterministic column sums] in column_sums.h.
void AccumulateColumnSums(const float* dy, int64_t rows, int64_t cols, float* dbias) {
#pragma omp parallel if (rows * cols >= cpu::kParallelGrain)
  SumColumnBlocks<1>(rows, cols, {dbias}, [&](int64_t r, int64_t c0, int64_t width, auto& acc) {
    const float* row = dy + r * cols + c0;
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) acc[0][c] += row[c];
  });
}

}  // namespace cpu

namespace {

// The sizes of a linear layer: weight [OC, C] and x [..., C] with `rows` rows; checks both
// and the output-side tensor `out` ([..., OC]) named `out_name`.
struct LinearDims {
  int64_t oc, ch, rows;
};
// Every float dtype passes here; the fp32 path reads the tensors only when all are fp32.
LinearDims CheckLinear(const Tensor& x, const Tensor& weight, const Tensor& out,
                       const char* out_name, const Tensor& bias, const char* op) {
  cpu::CheckCpuFloat(weight, op, "weight");
  ZTRAIN_CHECK(weight.dim() == 2, op, ": weight must be [OC, C], got ",
               ShapeToString(weight.shape()));
  cpu::CheckCpuFloat(x, op, "x");
  const int64_t ch = weight.size(1);
  ZTRAIN_CHECK(x.dim() >= 1 && x.size(-1) == ch, op, ": x has shape ", ShapeToString(x.shape()),
               ", expected [..., ", ch, "]");
  const LinearDims d{weight.size(0), ch, ch == 0 ? 0 : x.numel() / ch};
  cpu::CheckCpuFloat(out, cpu::WithLastDim(x.shape(), d.oc), op, out_name);
  if (bias.defined()) {
    cpu::CheckCpuFloat(bias, {d.oc}, op, out_name[0] == 'd' ? "dbias" : "bias");
  }
  return d;
}

}  // namespace

void CpuOps::Gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                  float beta, const Tensor& c) {
  constexpr const char* kOp = "Gemm";
  cpu::CheckCpuFloat(a, kOp, "a");
  cpu::CheckCpuFloat(b, kOp, "b");
  cpu::CheckCpuFloat(c, kOp, "c");
  const GemmShape s = CheckGemmShapes(trans_a, trans_b, a, b, c, kOp);
  const int64_t m = s.m, n = s.n, k = s.k;
  if (cpu::AnyHalf(a, b, c)) {
    cpu::Widened w(scratch_);
    MixedGemm(trans_a, trans_b, alpha, a, b, Tensor(), beta, c, w, kOp);
    w.Commit();
    return;
  }
  cpu::Sgemm(trans_a, trans_b, m, n, k, alpha, a.data<float>(), a.size(1), b.data<float>(),
             b.size(1), beta, c.data<float>(), n, kOp, gemm_plan_);
}

void CpuOps::LinearForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                           const Tensor& y) {
  constexpr const char* kOp = "LinearForward";
  const auto [oc, ch, rows] = CheckLinear(x, weight, y, "y", bias, kOp);
  if (cpu::AnyHalf(x, weight, bias, y)) {
    cpu::Widened w(scratch_);
    MixedGemm(false, true, 1.0f, x.View({rows, ch}), weight, bias, 0.0f, y.View({rows, oc}), w,
              kOp);
    w.Commit();
    return;
  }

  cpu::Sgemm(false, true, rows, oc, ch, 1.0f, x.data<float>(), ch, weight.data<float>(), ch, 0.0f,
             y.data<float>(), oc, kOp, gemm_plan_);
  if (bias.defined()) cpu::AddBiasRows(y.data<float>(), bias.data<float>(), rows, oc);
}

void CpuOps::LinearBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                            const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  constexpr const char* kOp = "LinearBackward";
  const auto [oc, ch, rows] = CheckLinear(x, weight, dy, "dy", dbias, kOp);
  if (dweight.defined()) cpu::CheckCpuFloat(dweight, weight.shape(), kOp, "dweight");
  if (dx.defined()) cpu::CheckCpuFloat(dx, x.shape(), kOp, "dx");
  if (cpu::AnyHalf(dy, x, weight, dx, dweight, dbias)) {
    return MixedLinearBackward(dy, x, weight, dx, dweight, dbias, kOp);
  }

  const float* g = dy.data<float>();
  if (dx.defined()) {  // dx[N,C] = dy[N,OC] @ W[OC,C]
    cpu::Sgemm(false, false, rows, ch, oc, 1.0f, g, oc, weight.data<float>(), ch, 0.0f,
               dx.data<float>(), ch, kOp, gemm_plan_);
  }
  if (dweight.defined()) {  // dW[OC,C] += dy^T[OC,N] @ x[N,C]; a frozen weight has none
    cpu::Sgemm(true, false, oc, ch, rows, 1.0f, g, oc, x.data<float>(), ch, 1.0f,
               dweight.data<float>(), ch, kOp, gemm_plan_);
  }
  if (dbias.defined()) cpu::AccumulateColumnSums(g, rows, oc, dbias.data<float>());
}

}  // namespace ztrain::kernels
