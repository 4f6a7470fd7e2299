#include "optim/grad_clip.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "optim/adam_kernels.h"

namespace ztrain::optim {
namespace {

// Blocks of a fixed size (a multiple of 16, so the 16-lane pattern restarts at each block's
// first element) make the summation order independent of the thread count.
constexpr int64_t kBlock = 65536;

struct Block {
  const float* data;
  int64_t count;
};

using SquaredSumFn = double (*)(const float*, int64_t);

SquaredSumFn SquaredSumFor(AdamImpl impl) {
  switch (detail::ResolveImpl(impl)) {
    case AdamImpl::kAvx512:
      return detail::SquaredSumAvx512;
    case AdamImpl::kAvx2:
      return detail::SquaredSumAvx2;
    default:
      return detail::SquaredSumScalar;
  }
}

std::vector<Block> SplitIntoBlocks(std::span<const Tensor> grads) {
  std::vector<Block> blocks;
  for (size_t t = 0; t < grads.size(); ++t) {
    const Tensor& g = grads[t];
    ZTRAIN_CHECK(g.dtype() == DType::kF32 && g.device().is_cpu(), "GradSquaredSum: gradient ", t,
                 " is ", DTypeName(g.dtype()), " on ", g.device().ToString(),
                 "; expected fp32 on cpu");
    const float* data = g.data<const float>();
    for (int64_t begin = 0; begin < g.numel(); begin += kBlock) {
      blocks.push_back({data + begin, std::min(kBlock, g.numel() - begin)});
    }
  }
  return blocks;
}

}  // namespace

double GradSquaredSum(std::span<const Tensor> grads, AdamImpl impl) {
  const SquaredSumFn fn = SquaredSumFor(impl);
  const std::vector<Block> blocks = SplitIntoBlocks(grads);
  const int64_t nblocks = static_cast<int64_t>(blocks.size());
  std::vector<double> partial(blocks.size());
#pragma omp parallel for schedule(static) if (nblocks >= 4)
  for (int64_t b = 0; b < nblocks; ++b) partial[b] = fn(blocks[b].data, blocks[b].count);
  double sum = 0.0;
  for (double p : partial) sum += p;
  return sum;
}

double GradSquaredSum(kernels::Ops& ops, std::span<const Tensor> grads) {
  const bool on_host =
      std::all_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.device().is_cpu(); });
  if (on_host) return GradSquaredSum(grads);
  double sum = 0.0;
  for (size_t t = 0; t < grads.size(); ++t) {
    ZTRAIN_CHECK(grads[t].device() == ops.device(), "GradSquaredSum: gradient ", t, " is on ",
                 grads[t].device().ToString(), "; expected every gradient on ",
                 ops.device().ToString(), " (ops' device) or every one on cpu");
    sum += ops.SumSquares(grads[t]);
  }
  return sum;
}

double GlobalNorm(std::span<const Tensor> grads, AdamImpl impl) {
  return std::sqrt(GradSquaredSum(grads, impl));
}

float ClipCoefficient(double norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(norm)) return 1.0f;
  const double coefficient = max_norm / (norm + 1e-6);  // DeepSpeed's epsilon
  return coefficient < 1.0 ? static_cast<float>(coefficient) : 1.0f;
}

float UnscaleAndClipCoefficient(double scaled_norm, double loss_scale, double max_norm) {
  ZTRAIN_CHECK(loss_scale > 0.0, "UnscaleAndClipCoefficient: loss_scale must be > 0, got ",
               loss_scale);
  double combined_scale = loss_scale;
  if (max_norm > 0.0 && std::isfinite(scaled_norm)) {
    const double clip = (scaled_norm / loss_scale + 1e-6) / max_norm;
    if (clip > 1.0) combined_scale = clip * loss_scale;
  }
  return static_cast<float>(1.0 / combined_scale);
}

}  // namespace ztrain::optim
