// LayerNorm over the last dimension, eps = 1e-5 (GPT-2), backward as llm.c's
// layernorm_backward with dx overwritten.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/check.h"
#include "kernels/cpu/column_sums.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/widen.h"

namespace ztrain::kernels {
namespace {

constexpr float kEps = 1e-5f;

void NormalizeRow(const float* x, const float* w, const float* b, int64_t ch, float* y,
                  float* mean_out, float* rstd_out) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < ch; ++c) sum += x[c];
  const float mean = sum / static_cast<float>(ch);
  float var = 0.0f;  // two passes: no cancellation when |mean| >> std
#pragma omp simd reduction(+ : var)
  for (int64_t c = 0; c < ch; ++c) var += (x[c] - mean) * (x[c] - mean);
  const float rstd = 1.0f / std::sqrt(var / static_cast<float>(ch) + kEps);
#pragma omp simd
  for (int64_t c = 0; c < ch; ++c) y[c] = (x[c] - mean) * rstd * w[c] + b[c];
  *mean_out = mean;
  *rstd_out = rstd;
}

// dx = rstd * (w dy - mean(w dy) - xhat * mean(w dy xhat)), xhat = (x - mean) * rstd.
void RowInputGrad(const float* dy, const float* x, const float* w, float mean, float rstd,
                  int64_t ch, float* dx) {
  float sum_g = 0.0f, sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t c = 0; c < ch; ++c) {
    const float g = w[c] * dy[c];
    sum_g += g;
    sum_gx += g * (x[c] - mean) * rstd;
  }
  const float mean_g = sum_g / static_cast<float>(ch);
  const float mean_gx = sum_gx / static_cast<float>(ch);
#pragma omp simd
  for (int64_t c = 0; c < ch; ++c) {
    const float xhat = (x[c] - mean) * rstd;
    dx[c] = (w[c] * dy[c] - mean_g - xhat * mean_gx) * rstd;
  }
}

struct LayerNormArgs {
  int64_t rows, channels;
};

LayerNormArgs CheckLayerNormArgs(const Tensor& x, const Tensor& weight, const Tensor& mean,
                                 const Tensor& rstd, const char* op) {
  cpu::CheckCpu(weight, op, "weight");
  ZTRAIN_CHECK(weight.dim() == 1, op, ": weight must be [C], got ",
               ShapeToString(weight.shape()));
  const int64_t ch = weight.size(0);
  const int64_t rows = cpu::RowsOf(x, ch, op, "x");
  cpu::CheckCount(mean, rows, op, "mean");
  cpu::CheckCount(rstd, rows, op, "rstd");
  return {rows, ch};
}

}  // namespace

void CpuOps::LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                              const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  constexpr const char* kOp = "LayerNormForward";
  if (cpu::AnyHalf(x, weight, bias, y)) {  // Note [Widening adapter]; mean/rstd stay fp32
    cpu::Widened w(scratch_);
    LayerNormForward(w.In(x), w.In(weight), w.In(bias), w.Out(y), mean, rstd);
    w.Commit();
    return;
  }
  const LayerNormArgs a = CheckLayerNormArgs(x, weight, mean, rstd, kOp);
  cpu::CheckCpu(bias, weight.shape(), kOp, "bias");
  cpu::CheckCpu(y, x.shape(), kOp, "y");
  const int64_t ch = a.channels;
  const float* xp = x.data<float>();
  const float* w = weight.data<float>();
  const float* b = bias.data<float>();
  float* yp = y.data<float>();
  float* mp = mean.data<float>();
  float* rp = rstd.data<float>();
#pragma omp parallel for schedule(static) if (a.rows * ch >= cpu::kParallelGrain)
  for (int64_t r = 0; r < a.rows; ++r) {
    NormalizeRow(xp + r * ch, w, b, ch, yp + r * ch, mp + r, rp + r);
  }
}

// dweight and dbias by column blocks (Note [Deterministic column sums]), then rows in
// parallel for dx.
void CpuOps::LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                               const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                               const Tensor& dweight, const Tensor& dbias) {
  constexpr const char* kOp = "LayerNormBackward";
  if (cpu::AnyHalf(dy, x, weight, dx, dweight, dbias)) {
    cpu::Widened w(scratch_);
    LayerNormBackward(w.In(dy), w.In(x), w.In(weight), mean, rstd, w.Out(dx), w.InOut(dweight),
                      w.InOut(dbias));
    w.Commit();
    return;
  }
  const LayerNormArgs a = CheckLayerNormArgs(x, weight, mean, rstd, kOp);
  cpu::CheckCpu(dy, x.shape(), kOp, "dy");
  cpu::CheckCpu(dx, x.shape(), kOp, "dx");
  if (dweight.defined()) cpu::CheckCpu(dweight, weight.shape(), kOp, "dweight");
  if (dbias.defined()) cpu::CheckCpu(dbias, weight.shape(), kOp, "dbias");
  const int64_t ch = a.channels, rows = a.rows;
  const float* g = dy.data<float>();
  const float* xp = x.data<float>();
  const float* w = weight.data<float>();
  const float* mp = mean.data<float>();
  const float* rp = rstd.data<float>();
  float* dxp = dx.data<float>();
  // One frozen gradient (Note [Frozen parameters]): its sums go to `discard`, so the other
  // comes out of the same code bit for bit. Neither defined: no sums at all.
  const bool sums = dweight.defined() || dbias.defined();
  std::vector<float> discard(dweight.defined() != dbias.defined() ? ch : 0);
  float* dw = dweight.defined() ? dweight.data<float>() : discard.data();
  float* db = dbias.defined() ? dbias.data<float>() : discard.data();
  const auto terms = [&](int64_t r, int64_t c0, int64_t width, auto& acc) {
    const float* gr = g + r * ch + c0;
    const float* xr = xp + r * ch + c0;
    const float m = mp[r], s = rp[r];
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) {
      acc[0][c] += gr[c] * (xr[c] - m) * s;
      acc[1][c] += gr[c];
    }
  };
#pragma omp parallel if (rows * ch >= cpu::kParallelGrain)
  {
    // Its barrier: dy and x are read before dx (which may alias either) is written. `sums`
    // is the same on every thread, so all meet the same worksharing loops.
    if (sums) cpu::SumColumnBlocks<2>(rows, ch, {dw, db}, terms);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      RowInputGrad(g + r * ch, xp + r * ch, w, mp[r], rp[r], ch, dxp + r * ch);
    }
  }
}

}  // namespace ztrain::kernels
