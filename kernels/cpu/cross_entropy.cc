// Fused softmax + cross-entropy over a padded vocabulary, writing dlogits over the logits.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/check.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/widen.h"
#include "kernels/vocab_slice_check.h"

namespace ztrain::kernels {
namespace {

// The row sum of exp is accumulated in float over blocks of this many columns and in double
// across blocks: vectorised, yet accurate for a 50k vocabulary.
constexpr int64_t kSumBlock = 512;

// Explicit lanes: GCC leaves a max-reduction loop scalar where it inlines this function.
// NaN logits are skipped here and surface through the sum of exp instead.
float RowMax(const float* row, int64_t v) {
  constexpr int kLanes = 16;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, kNegInf);
  int64_t j = 0;
  for (; j + kLanes <= v; j += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) lanes[l] = row[j + l] > lanes[l] ? row[j + l] : lanes[l];
  }
  float m = kNegInf;
  for (; j < v; ++j) m = row[j] > m ? row[j] : m;
  for (float lane : lanes) m = lane > m ? lane : m;
  return m;
}

// Sum of exp(row[j] - max) over [0, v); when `keep` is set, row[j] becomes that exp.
double RowSumExp(float* row, int64_t v, float max, bool keep) {
  double total = 0.0;
  for (int64_t j0 = 0; j0 < v; j0 += kSumBlock) {
    const int64_t j1 = std::min(v, j0 + kSumBlock);
    float part = 0.0f;
    if (keep) {
#pragma omp simd reduction(+ : part)
      for (int64_t j = j0; j < j1; ++j) {
        row[j] = cpu::FastExp(row[j] - max);
        part += row[j];
      }
    } else {
#pragma omp simd reduction(+ : part)
      for (int64_t j = j0; j < j1; ++j) part += cpu::FastExp(row[j] - max);
    }
    total += part;
  }
  return total;
}

// Every target is a token of [0, vocab) or kIgnoreTarget; throws naming the first that is neither.
void CheckTargets(const int32_t* targets, int64_t rows, int64_t vocab, const char* op) {
  for (int64_t r = 0; r < rows; ++r) {
    ZTRAIN_CHECK(targets[r] == kIgnoreTarget || (targets[r] >= 0 && targets[r] < vocab), op,
                 ": target ", targets[r], " at row ", r, " is outside [0, ", vocab,
                 ") and is not the ignored target ", kIgnoreTarget);
  }
}

// Returns the loss of one row; with dloss, turns the row into its dlogits. An ignored target
// (kIgnoreTarget) has no loss and no gradient.
float RowCrossEntropy(float* row, int64_t v, int64_t vp, int32_t target, const float* dloss) {
  if (target == kIgnoreTarget) {
    if (dloss) std::fill(row, row + vp, 0.0f);
    return 0.0f;
  }
  const float max = RowMax(row, v);
  const float target_logit = row[target];
  const double sum = RowSumExp(row, v, max, dloss != nullptr);
  const float loss = static_cast<float>(std::log(sum) + max - target_logit);
  if (dloss) {
    const float scale = static_cast<float>(*dloss / sum);
#pragma omp simd
    for (int64_t j = 0; j < v; ++j) row[j] *= scale;
    row[target] -= *dloss;
    std::fill(row + v, row + vp, 0.0f);
  }
  return loss;
}

}  // namespace

// 16-bit logits (arguments checked): the fp32 op on blocks of rows, each block widened, and
// with dlosses its dlogits rounded back in place (Note [Widening adapter]).
void CpuOps::HalfSoftmaxCrossEntropy(const Tensor& logits, const Tensor& targets, int64_t vocab,
                                     const Tensor& losses, const Tensor& dlosses) {
  const int64_t vp = logits.size(-1), rows = logits.numel() / vp;
  const int64_t block = std::max<int64_t>(cpu::kChunkElements / vp, 4 * omp_get_max_threads());
  cpu::ForEachChunk(scratch_, rows, block, [&](cpu::Widened& w, int64_t r0, int64_t r1) {
    const Tensor part = logits.Flat(r0 * vp, {r1 - r0, vp});
    SoftmaxCrossEntropy(dlosses.defined() ? w.InOut(part) : w.In(part), targets.Flat(r0, {r1 - r0}),
                        vocab, losses.Flat(r0, {r1 - r0}),
                        dlosses.defined() ? dlosses.Flat(r0, {r1 - r0}) : Tensor());
  });
}

void CpuOps::SoftmaxCrossEntropy(const Tensor& logits, const Tensor& targets, int64_t vocab,
                                 const Tensor& losses, const Tensor& dlosses) {
  constexpr const char* kOp = "SoftmaxCrossEntropy";
  cpu::CheckCpuFloat(logits, kOp, "logits");
  ZTRAIN_CHECK(logits.dim() >= 1, kOp, ": logits must be [N, Vp], got a scalar");
  const int64_t vp = logits.size(-1);
  ZTRAIN_CHECK(vocab > 0 && vocab <= vp, kOp, ": vocab = ", vocab,
               " must be in [1, Vp = ", vp, "] (logits ", ShapeToString(logits.shape()), ")");
  const int64_t rows = cpu::RowsOf(logits, vp, kOp, "logits", logits.dtype());
  cpu::CheckCount(targets, rows, kOp, "targets", DType::kI32);
  cpu::CheckCount(losses, rows, kOp, "losses");
  if (dlosses.defined()) cpu::CheckCount(dlosses, rows, kOp, "dlosses");
  const int32_t* tgt = targets.data<int32_t>();
  CheckTargets(tgt, rows, vocab, kOp);
  if (cpu::AnyHalf(logits)) return HalfSoftmaxCrossEntropy(logits, targets, vocab, losses, dlosses);
  float* lp = logits.data<float>();
  float* out = losses.data<float>();
  const float* dl = dlosses.defined() ? dlosses.data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (rows * vp >= cpu::kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    out[r] = RowCrossEntropy(lp + r * vp, vocab, vp, tgt[r], dl ? dl + r : nullptr);
  }
}

namespace {

// The sizes of a vocabulary-parallel cross-entropy call, its arguments checked.
struct VocabParallelDims {
  int64_t rows, columns, real;
};

VocabParallelDims CheckVocabParallelArgs(const Tensor& logits, const Tensor& targets,
                                         const VocabSlice& slice, const Tensor& stats,
                                         const char* op) {
  cpu::CheckCpuFloat(logits, op, "logits");
  ZTRAIN_CHECK(logits.dim() == 2, op, ": logits must be [N, Vl], got ",
               ShapeToString(logits.shape()));
  const int64_t rows = logits.size(0), columns = logits.size(1);
  CheckColumnSlice(slice, op);
  cpu::CheckCount(targets, rows, op, "targets", DType::kI32);
  cpu::CheckCpu(stats, {3, rows}, op, "stats");
  return {rows, columns, slice.RealRows(columns)};
}

}  // namespace

void CpuOps::VocabParallelCrossEntropy(CrossEntropyStep step, const Tensor& logits,
                                       const Tensor& targets, const VocabSlice& slice,
                                       const Tensor& stats, const Tensor& losses) {
  constexpr const char* kOp = "VocabParallelCrossEntropy";
  const VocabParallelDims d = CheckVocabParallelArgs(logits, targets, slice, stats, kOp);
  float* max = stats.data<float>();
  float* sum_exp = max + d.rows;
  float* target_logit = sum_exp + d.rows;
  const int32_t* tgt = targets.data<int32_t>();
  if (step == CrossEntropyStep::kLoss) {
    cpu::CheckCount(losses, d.rows, kOp, "losses");
    float* loss = losses.data<float>();
    for (int64_t r = 0; r < d.rows; ++r) {
      loss[r] = tgt[r] == kIgnoreTarget
                    ? 0.0f
                    : static_cast<float>(std::log(static_cast<double>(sum_exp[r])) + max[r] -
                                         target_logit[r]);
    }
    return;
  }
  if (step == CrossEntropyStep::kMax) CheckTargets(tgt, d.rows, slice.vocab, kOp);
  const auto* base = static_cast<const char*>(logits.data());
  const size_t row_bytes = d.columns * DTypeSize(logits.dtype());
#pragma omp parallel if (d.rows * d.columns >= cpu::kParallelGrain)
  {
    std::vector<float> z(static_cast<size_t>(d.real));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < d.rows; ++r) {
      cpu::WidenSerial(base + r * row_bytes, logits.dtype(), z.data(), d.real);
      if (step == CrossEntropyStep::kMax) {
        max[r] = RowMax(z.data(), d.real);  // -inf for a slice of padding only
        continue;
      }
      sum_exp[r] = static_cast<float>(RowSumExp(z.data(), d.real, max[r], false));
      const int64_t local = tgt[r] - slice.begin;
      target_logit[r] = local >= 0 && local < d.real ? z[local] : 0.0f;
    }
  }
}

void CpuOps::VocabParallelCrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                               const VocabSlice& slice, const Tensor& stats,
                                               const Tensor& dlosses) {
  constexpr const char* kOp = "VocabParallelCrossEntropyBackward";
  const VocabParallelDims d = CheckVocabParallelArgs(logits, targets, slice, stats, kOp);
  cpu::CheckCount(dlosses, d.rows, kOp, "dlosses");
  const float* max = stats.data<float>();
  const float* sum_exp = max + d.rows;
  const float* dloss = dlosses.data<float>();
  const int32_t* tgt = targets.data<int32_t>();
  auto* base = static_cast<char*>(logits.data());
  const size_t row_bytes = d.columns * DTypeSize(logits.dtype());
#pragma omp parallel if (d.rows * d.columns >= cpu::kParallelGrain)
  {
    std::vector<float> z(static_cast<size_t>(d.columns));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < d.rows; ++r) {
      cpu::WidenSerial(base + r * row_bytes, logits.dtype(), z.data(), d.real);
      if (tgt[r] == kIgnoreTarget) {  // no loss, no gradient
        std::fill(z.begin(), z.end(), 0.0f);
        cpu::NarrowSerial(z.data(), base + r * row_bytes, logits.dtype(), d.columns);
        continue;
      }
      const float scale = static_cast<float>(dloss[r] / static_cast<double>(sum_exp[r]));
#pragma omp simd
      for (int64_t j = 0; j < d.real; ++j) z[j] = cpu::FastExp(z[j] - max[r]) * scale;
      std::fill(z.begin() + d.real, z.end(), 0.0f);
      const int64_t local = tgt[r] - slice.begin;
      if (local >= 0 && local < d.real) z[local] -= dloss[r];
      cpu::NarrowSerial(z.data(), base + r * row_bytes, logits.dtype(), d.columns);
    }
  }
}

}  // namespace ztrain::kernels
