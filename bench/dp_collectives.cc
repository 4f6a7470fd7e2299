#include "bench/dp_collectives.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "parallel/zero/flat_layout.h"

namespace ztrain::bench {
namespace {

Tensor View(const FloatArray& a) {
  return Tensor(a.data(), DType::kF32, {static_cast<int64_t>(a.size())});
}

}  // namespace

LayerLayout LayoutOf(const Engine& engine, int dp) {
  LayerLayout out;
  std::map<std::string, size_t> owner;
  const auto& layers = engine.layers();
  for (size_t l = 0; l < layers.size(); ++l) {
    zero::UnitUse units;
    std::vector<zero::FlatParam> flat;
    for (const nn::ParamSpec& s : layers[l]->Params()) {
      if (s.tied_to.empty()) owner[s.name] = l;
      flat.push_back({s.name, NumElements(s.shape), s.trainable, s.packed, s.tied_to.empty()});
      const size_t u = owner.at(s.tied_to.empty() ? s.name : s.tied_to);
      if (std::find(units.begin(), units.end(), u) == units.end()) units.push_back(u);
    }
    zero::FlatLayoutOptions options;
    options.dp = dp;
    out.padded.push_back(zero::LayOut(flat, options).padded);
    out.units.push_back(std::move(units));
  }
  return out;
}

int CountBuckets(const LayerLayout& layout, int64_t bucket_size) {
  int buckets = 0;
  int64_t pending = 0;
  for (size_t l = layout.padded.size(); l-- > 0;) {
    pending += layout.padded[l];
    if (pending >= bucket_size || l == 0) {
      ++buckets;
      pending = 0;
    }
  }
  return buckets;
}

StepCollectives::StepCollectives(const LayerLayout& layout, const ZeroConfig& zero,
                                 comm::Communicator& dp)
    : zero_(zero), dp_(dp) {
  for (int64_t n : layout.padded) {
    grads_.emplace_back(n);
    if (zero.stage == 0) continue;
    params_.emplace_back(n);
    grad_shards_.emplace_back(n / dp.size());
    param_shards_.emplace_back(n / dp.size());
  }
  if (zero.stage != 3) return;
  std::vector<zero::UnitUse> uses(layout.units);  // forward 0..n-1, then backward n-1..0
  uses.insert(uses.end(), layout.units.rbegin(), layout.units.rend());
  const zero::GatherLimits limits{.prefetch_bucket = zero.stage3_prefetch_bucket_size,
                                  .max_live = zero.stage3_max_live_parameters,
                                  .max_reuse_distance = zero.stage3_max_reuse_distance,
                                  .persistence_threshold = zero.stage3_param_persistence_threshold};
  plan_ = zero::PlanGathers(layout.padded, uses, limits);
}

void StepCollectives::Run() {
  const size_t n = grads_.size();
  if (zero_.stage == 3) {
    for (size_t l = 0; l < n; ++l) Gather(plan_.actions[l].fetch);
  }
  for (size_t l = n; l-- > 0;) {
    if (zero_.stage == 3) Gather(plan_.actions[2 * n - 1 - l].fetch);
    works_.push_back(ReduceGradients(l));
  }
  Scalar();  // the loss mean
  if (zero_.stage == 0) return;
  Scalar();  // the gradient norm's sum of squares
  if (zero_.stage == 3) return;
  for (size_t l = 0; l < n; ++l) {
    works_.push_back(dp_.AllGather(View(param_shards_[l]), View(params_[l])));
  }
  WaitAll();
}

comm::WorkPtr StepCollectives::ReduceGradients(size_t layer) {
  if (zero_.stage == 0 || !zero_.reduce_scatter) return dp_.AllReduce(View(grads_[layer]));
  return dp_.ReduceScatter(View(grads_[layer]), View(grad_shards_[layer]));
}

void StepCollectives::Gather(const std::vector<size_t>& layers) {
  for (size_t l : layers) {
    works_.push_back(dp_.AllGather(View(param_shards_[l]), View(params_[l])));
  }
}

void StepCollectives::WaitAll() {
  for (auto& w : works_) w->Wait();
  works_.clear();
}

void StepCollectives::Scalar() {
  WaitAll();
  float v = 0.0f;
  dp_.AllReduce(Tensor(&v, DType::kF32, {1}))->Wait();
}

}  // namespace ztrain::bench
