// RMSNorm over the last dimension (Llama): y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) +
// eps), in fp32 with rstd saved (fp32) for the backward.
#include <cmath>

#include "kernels/cpu/check.h"
#include "kernels/cpu/column_sums.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/widen.h"

namespace ztrain::kernels {
namespace {

void NormalizeRow(const float* x, const float* w, int64_t ch, float eps, float* y,
                  float* rstd_out) {
  float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
  for (int64_t c = 0; c < ch; ++c) sum_sq += x[c] * x[c];
  const float rstd = 1.0f / std::sqrt(sum_sq / static_cast<float>(ch) + eps);
#pragma omp simd
  for (int64_t c = 0; c < ch; ++c) y[c] = x[c] * rstd * w[c];
  *rstd_out = rstd;
}

// dx = rstd * (w dy - xhat * mean(w dy xhat)), xhat = x * rstd: d rstd / dx_c is
// -rstd^3 x_c / C, the only path besides the direct one.
void RowInputGrad(const float* dy, const float* x, const float* w, float rstd, int64_t ch,
                  float* dx) {
  float sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_gx)
  for (int64_t c = 0; c < ch; ++c) sum_gx += w[c] * dy[c] * x[c] * rstd;
  const float mean_gx = sum_gx / static_cast<float>(ch);
#pragma omp simd
  for (int64_t c = 0; c < ch; ++c) dx[c] = (w[c] * dy[c] - x[c] * rstd * mean_gx) * rstd;
}

// Checks weight [C], x [..., C] and rstd (N = numel(x) / C elements); returns N.
int64_t CheckRmsNormArgs(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                         const char* op) {
  cpu::CheckCpu(weight, op, "weight");
  ZTRAIN_CHECK(weight.dim() == 1, op, ": weight must be [C], got ", ShapeToString(weight.shape()));
  const int64_t rows = cpu::RowsOf(x, weight.size(0), op, "x");
  cpu::CheckCount(rstd, rows, op, "rstd");
  return rows;
}

}  // namespace

void CpuOps::RmsNormForward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                            const Tensor& rstd) {
  constexpr const char* kOp = "RmsNormForward";
  if (cpu::AnyHalf(x, weight, y)) {  // Note [Widening adapter]; rstd stays fp32
    cpu::Widened w(scratch_);
    RmsNormForward(w.In(x), w.In(weight), eps, w.Out(y), rstd);
    w.Commit();
    return;
  }
  ZTRAIN_CHECK(std::isfinite(eps) && eps >= 0.0f, kOp, ": eps = ", eps, " must be finite and >= 0");
  const int64_t rows = CheckRmsNormArgs(x, weight, rstd, kOp);
  cpu::CheckCpu(y, x.shape(), kOp, "y");
  const int64_t ch = weight.size(0);
  const float* xp = x.data<float>();
  const float* w = weight.data<float>();
  float* yp = y.data<float>();
  float* rp = rstd.data<float>();
#pragma omp parallel for schedule(static) if (rows * ch >= cpu::kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) NormalizeRow(xp + r * ch, w, ch, eps, yp + r * ch, rp + r);
}

// dweight by column blocks (Note [Deterministic column sums]), then rows in parallel for dx.
void CpuOps::RmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                             const Tensor& rstd, const Tensor& dx, const Tensor& dweight) {
  constexpr const char* kOp = "RmsNormBackward";
  if (cpu::AnyHalf(dy, x, weight, dx, dweight)) {
    cpu::Widened w(scratch_);
    RmsNormBackward(w.In(dy), w.In(x), w.In(weight), rstd, w.Out(dx), w.InOut(dweight));
    w.Commit();
    return;
  }
  const int64_t rows = CheckRmsNormArgs(x, weight, rstd, kOp);
  cpu::CheckCpu(dy, x.shape(), kOp, "dy");
  cpu::CheckCpu(dx, x.shape(), kOp, "dx");
  if (dweight.defined()) cpu::CheckCpu(dweight, weight.shape(), kOp, "dweight");
  const int64_t ch = weight.size(0);
  const float* g = dy.data<float>();
  const float* xp = x.data<float>();
  const float* w = weight.data<float>();
  const float* rp = rstd.data<float>();
  float* dxp = dx.data<float>();
  float* dw = dweight.data<float>();  // null for a frozen weight (Note [Frozen parameters])
  const auto term = [&](int64_t r, int64_t c0, int64_t width, auto& acc) {
    const float* gr = g + r * ch + c0;
    const float* xr = xp + r * ch + c0;
    const float s = rp[r];
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) acc[0][c] += gr[c] * xr[c] * s;
  };
#pragma omp parallel if (rows * ch >= cpu::kParallelGrain)
  {
    // Its barrier: dy and x are read before dx (which may alias either) is written. `dw` is
    // the same on every thread, so all meet the same worksharing loops.
    if (dw != nullptr) cpu::SumColumnBlocks<1>(rows, ch, {dw}, term);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      RowInputGrad(g + r * ch, xp + r * ch, w, rp[r], ch, dxp + r * ch);
    }
  }
}

}  // namespace ztrain::kernels
