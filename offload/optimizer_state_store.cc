#include "offload/optimizer_state_store.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/error.h"

namespace ztrain::offload {

namespace {
double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

OptimizerStateStore::OptimizerStateStore(Place place, kernels::Ops& ops,
                                         ParamStore::Allocate allocate, bool computes)
    : place_(place), ops_(ops), allocate_(std::move(allocate)), computes_(computes) {}

OptimizerStateStore::~OptimizerStateStore() = default;

void OptimizerStateStore::AddLayer(int64_t opt_len) {
  const int64_t base = layers_.empty() ? 0 : layers_.back().base + layers_.back().opt_len;
  Layer& layer = layers_.emplace_back();
  layer.opt_len = opt_len;
  layer.base = base;
  if (place_ == Place::kNvme) return;  // the swapper holds m and v
  layer.m = allocate_(place_, opt_len, MemoryCategory::kOptimizerState, DType::kF32);
  layer.v = allocate_(place_, opt_len, MemoryCategory::kOptimizerState, DType::kF32);
}

void OptimizerStateStore::SwapTo(std::unique_ptr<OptimizerSwapper> swapper,
                                 std::shared_ptr<const void> needs) {
  ZTRAIN_ASSERT(place_ == Place::kNvme);
  swapper_needs_ = std::move(needs);
  swapper_ = std::move(swapper);
}

std::pair<Tensor, Tensor> OptimizerStateStore::DeviceState(size_t l) const {
  const Layer& layer = layers_[l];
  return {layer.m.AsTensor(DType::kF32, {layer.opt_len}),
          layer.v.AsTensor(DType::kF32, {layer.opt_len})};
}

void OptimizerStateStore::Walk(std::optional<size_t> layer, const Range& fn, bool save) {
  if (!swapper_) {
    const size_t first = layer.value_or(0), last = layer ? *layer + 1 : layers_.size();
    for (size_t l = first; l < last; ++l) WalkMemory(l, fn, save);
    return;
  }
  double in_fn = 0.0;  // the wait is the time in the walk less the time in fn
  const auto start = std::chrono::steady_clock::now();
  const OptimizerSwapper::TileStep step = [&](int64_t begin, int64_t count, float* m, float* v) {
    const auto fn_start = std::chrono::steady_clock::now();
    fn(begin, count, m, v);
    in_fn += SecondsSince(fn_start);
  };
  if (layer) {
    swapper_->ForEachTileOf(*layer, step, save);
  } else {
    swapper_->ForEachTile(step, save);
  }
  wait_seconds_ += std::max(0.0, SecondsSince(start) - in_fn);
}

void OptimizerStateStore::WalkMemory(size_t l, const Range& fn, bool save) {
  Layer& layer = layers_[l];
  if (layer.opt_len == 0) return;
  if (layer.m.device().is_cpu()) {
    fn(layer.base, layer.opt_len, layer.m.data<float>(), layer.v.data<float>());
    return;
  }
  const auto [m, v] = DeviceState(l);
  // A shape-only store's tensors have no values: one zero stands for them.
  std::vector<float> hm(computes_ ? static_cast<size_t>(layer.opt_len) : 1, 0.0f);
  std::vector<float> hv(hm.size(), 0.0f);
  if (computes_) {
    ops_.Copy(m, Tensor(hm.data(), DType::kF32, m.shape()));
    ops_.Copy(v, Tensor(hv.data(), DType::kF32, v.shape()));
    ops_.Synchronize();
  }
  fn(layer.base, layer.opt_len, hm.data(), hv.data());
  if (save && computes_) {
    ops_.Copy(Tensor(hm.data(), DType::kF32, m.shape()), m);
    ops_.Copy(Tensor(hv.data(), DType::kF32, v.shape()), v);
    ops_.Synchronize();
  }
}

void OptimizerStateStore::Prefetch(size_t l) {
  if (swapper_) swapper_->Prefetch(l);
}

}  // namespace ztrain::offload
