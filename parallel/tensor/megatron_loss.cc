// MegatronLinears' LM head: this rank's slice of the logits and the vocabulary-parallel
// cross-entropy (Megatron's), which never gathers the logits.
//
// For a row with logits z over the whole real vocabulary and target y:
//   loss = log(sum_j exp(z_j - m)) + m - z_y,   m = max_j z_j,
// and each of m, sum_j exp(z_j - m) and z_y splits over the vocabulary slices: m is the max
// of the slices' maxima (all-reduce kMax), and then the sum of exp and z_y are sums of the
// slices' parts (one all-reduce of both). The gradient
//   dz_j = (exp(z_j - m) / sum - [j == y]) * dloss
// needs only the row's m and sum, which forward saves, so backward issues no collective for
// it: only the all-reduce of the layernorm output's gradient (Megatron's f; the LM head is
// column-parallel over the vocabulary). Padded columns (>= vocab_size) take no part and get
// zero gradient, as in the single-process kernel.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "nn/layer_context.h"
#include "parallel/tensor/tp_common.h"
#include "parallel/tensor/megatron_linears.h"

namespace ztrain::tensor {
namespace {

// Checks every target before any collective is issued: the ranks see the same targets, so
// they all throw together and none is left waiting.
void CheckTargets(const Tensor& targets, int64_t vocab) {
  ZTRAIN_CHECK(targets.dtype() == DType::kI32, "vocabulary-parallel loss: targets must be int32");
  const int32_t* tgt = targets.data<int32_t>();
  for (int64_t r = 0; r < targets.numel(); ++r) {
    ZTRAIN_CHECK(tgt[r] >= 0 && tgt[r] < vocab, "vocabulary-parallel loss: target ", tgt[r], " at row ",
                 r, " is outside [0, ", vocab, ")");
  }
}

// The per-row statistics of the cross-entropy, saved in forward as one [3, N] tensor: the
// max, then (all-reduced together) the sum of exp and the target logit.
struct CeStats {
  float* max;
  float* sum_exp;
  float* target_logit;
};
CeStats StatsOf(const Tensor& stats) {
  const int64_t n = stats.size(1);
  float* p = stats.data<float>();
  return {p, p + n, p + 2 * n};
}

// This rank's rows of the padded vocabulary: [begin, begin + local), of which the first
// `real` are real tokens (< vocab).
struct VocabSlice {
  int64_t begin, local, real;
};

VocabSlice SliceOf(const Tensor& weight, int64_t vocab, const comm::Communicator& tp) {
  const int64_t local = weight.size(0), begin = local * tp.rank();
  return {begin, local, std::clamp<int64_t>(vocab - begin, 0, local)};
}

}  // namespace

void MegatronLinears::HeadLossForward(nn::LayerContext& ctx, const nn::MicroBatch& mb,
                                      const Tensor& h, const Tensor& weight, int64_t vocab,
                                      const Tensor& output) const {
  detail::CheckHostOps(ctx, "the vocabulary-parallel loss");
  const VocabSlice slice = SliceOf(weight, vocab, tp_);
  const int64_t n = h.size(0), vl = slice.local, real = slice.real, vocab_begin = slice.begin;
  CheckTargets(mb.targets, vocab);
  CheckTensor(output, DType::kF32, {n}, "lm_head output");
  // The logits are the compute dtype, as the whole head's; the statistics are fp32 (of the
  // rounded logits, as the single-process softmax's).
  const Tensor logits = ctx.Save("logits", ctx.dtype(), {n, vl});
  ctx.ops().LinearForward(h, weight, Tensor(), logits);

  const Tensor stats = ctx.Save("ce_stats", DType::kF32, {3, n});
  const CeStats s = StatsOf(stats);
  const int32_t* tgt = mb.targets.data<int32_t>();
  // A rank whose slice is all padding contributes -inf to the max and 0 to the sums.
#pragma omp parallel if (n * vl >= detail::kParallelGrain)
  {
    std::vector<float> z(static_cast<size_t>(real));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      detail::LoadElements(logits, r * vl, real, z.data());
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < real; ++j) m = std::max(m, z[j]);
      s.max[r] = m;
    }
  }
  tp_.AllReduce(stats.Flat(0, {n}), comm::ReduceOp::kMax)->Wait();
#pragma omp parallel if (n * vl >= detail::kParallelGrain)
  {
    std::vector<float> z(static_cast<size_t>(real));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      detail::LoadElements(logits, r * vl, real, z.data());
      double sum = 0.0;
      for (int64_t j = 0; j < real; ++j) sum += std::exp(z[j] - s.max[r]);
      s.sum_exp[r] = static_cast<float>(sum);
      const int64_t local = tgt[r] - vocab_begin;
      s.target_logit[r] = local >= 0 && local < real ? z[local] : 0.0f;
    }
  }
  tp_.AllReduce(stats.Flat(n, {2 * n}))->Wait();
  float* loss = output.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    loss[r] = static_cast<float>(std::log(static_cast<double>(s.sum_exp[r])) + s.max[r] -
                                 s.target_logit[r]);
  }
}

void MegatronLinears::HeadLossBackward(nn::LayerContext& ctx, const nn::MicroBatch& mb,
                                       const Tensor& h, const Tensor& weight, int64_t vocab,
                                       const Tensor& doutput, const Tensor& dh,
                                       const Tensor& dweight) const {
  detail::CheckHostOps(ctx, "the vocabulary-parallel loss");
  const VocabSlice slice = SliceOf(weight, vocab, tp_);
  const int64_t n = h.size(0), vl = slice.local, real = slice.real, vocab_begin = slice.begin;
  CheckTensor(doutput, DType::kF32, {n}, "lm_head doutput");
  // The saved logits become dlogits in place (as nn::LmHead does): no second [N, Vp/P].
  const Tensor logits = ctx.Saved("logits");
  const CeStats s = StatsOf(ctx.Saved("ce_stats"));
  const float* dloss = doutput.data<float>();
  const int32_t* tgt = mb.targets.data<int32_t>();
#pragma omp parallel if (n * vl >= detail::kParallelGrain)
  {
    std::vector<float> row(static_cast<size_t>(vl));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      detail::LoadElements(logits, r * vl, real, row.data());
      const float scale = dloss[r] / s.sum_exp[r];
      for (int64_t j = 0; j < real; ++j) row[j] = std::exp(row[j] - s.max[r]) * scale;
      std::fill(row.begin() + real, row.end(), 0.0f);
      const int64_t local = tgt[r] - vocab_begin;
      if (local >= 0 && local < real) row[local] -= dloss[r];
      detail::StoreElements(row.data(), logits, r * vl, vl);
    }
  }
  // dh = dlogits @ W_local is this rank's partial sum over its vocabulary slice (the head is
  // column-parallel over the vocabulary: Megatron's f).
  const nn::LinearGrad g{logits, weight, dweight, Tensor(), Buffer()};
  ColumnBackward(ctx, std::span<const nn::LinearGrad>(&g, 1), h, dh);
}

}  // namespace ztrain::tensor
