#include "parallel/zero/sharded_optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"

namespace ztrain::zero {

std::vector<OptimizerPart> PartsOf(const std::vector<OptimizedLayer>& layers,
                                   const std::vector<OptimizedParam>& params) {
  std::vector<int64_t> base(layers.size());
  for (size_t l = 0, b = 0; l < layers.size(); b += layers[l].opt_len, ++l) {
    base[l] = static_cast<int64_t>(b);
  }
  std::vector<OptimizerPart> parts;
  for (size_t i = 0; i < params.size(); ++i) {
    const OptimizedParam& p = params[i];
    if (!p.trained) continue;
    ZTRAIN_CHECK(p.layer < layers.size(), "parameter ", i, " is in layer ", p.layer, " of ",
                 layers.size());
    const OptimizedLayer& layer = layers[p.layer];
    const int64_t begin = std::max(p.offset, layer.opt_begin);
    const int64_t end = std::min(p.offset + p.elements, layer.opt_begin + layer.opt_len);
    if (begin < end)
      parts.push_back({i, p.layer, begin, end, base[p.layer] + begin - layer.opt_begin});
  }
  return parts;
}

std::vector<OptimizedLayer> OptimizedLayersOf(const ParamTable& table) {
  std::vector<OptimizedLayer> layers;
  for (size_t l = 0; l < table.num_layers(); ++l) {
    OptimizedLayer& layer = layers.emplace_back();
    layer.opt_begin = table.layer(l).layout.opt_begin;
    layer.opt_len = table.layer(l).layout.opt_len;
    for (size_t slot : table.layer(l).owned) {
      const ParamSlot& s = table.slot(slot);
      if (s.stage_copy && !s.frozen()) layer.leading_copy = NumElements(s.spec.shape);
    }
  }
  return layers;
}

std::vector<OptimizedParam> OptimizedParamsOf(const ParamTable& table) {
  std::vector<OptimizedParam> params;
  for (const ParamSlot& s : table.slots()) {
    params.push_back({s.layer, s.offset, NumElements(s.spec.shape), s.group, !s.frozen(),
                      !s.spec.tp.split(), s.stage_copy});
  }
  return params;
}

ShardedOptimizer::ShardedOptimizer(Options options, optim::ParamGroups groups,
                                   std::vector<OptimizedLayer> layers,
                                   std::vector<OptimizedParam> params, Groups comms,
                                   kernels::Ops& ops, OptimizerHooks hooks)
    : options_(std::move(options)),
      groups_(std::move(groups)),
      layers_(std::move(layers)),
      params_(std::move(params)),
      comms_(comms),
      ops_(ops),
      hooks_(std::move(hooks)),
      parts_(PartsOf(layers_, params_)) {
  ZTRAIN_ASSERT(comms_.dp && comms_.pp && comms_.tp,
                "the optimizer needs its dp, pp and tp groups");
  ZTRAIN_ASSERT(!options_.defer || options_.host_step, "a deferred step runs on the host");
  for (const OptimizedParam& p : params_) {
    ZTRAIN_ASSERT(p.group < groups_.size(), "parameter group ", p.group, " of ", groups_.size());
  }
  base_.resize(layers_.size());
  for (size_t l = 0, b = 0; l < layers_.size(); b += layers_[l].opt_len, ++l) {
    base_[l] = static_cast<int64_t>(b);
  }
}

double ShardedOptimizer::GradNorm() {
  std::vector<Tensor> grads;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Tensor g = hooks_.gradient(l);
    const int64_t skip =  // leading elements of g that belong to a copy
        std::clamp<int64_t>(layers_[l].leading_copy - layers_[l].opt_begin, 0, g.numel());
    if (skip < g.numel()) grads.push_back(g.Flat(skip, {g.numel() - skip}));
  }
  if (!options_.computes) grads.clear();  // shape-only: no values; the reductions still run
  comm::Communicator& tp = *comms_.tp;
  if (!options_.sharded && comms_.pp->size() == 1 && tp.size() == 1 && options_.host_gradients) {
    return optim::GlobalNorm(grads);
  }
  double squares = optim::GradSquaredSum(ops_, grads);
  if (tp.size() > 1 && options_.computes) {
    // Parameters whole on every tp rank (layernorms, row-parallel biases) have equal
    // gradients there: each rank counts 1/tp of them, so the tp sum counts them once.
    squares -= (1.0 - 1.0 / tp.size()) * ReplicatedSquares();
  }
  float sum = static_cast<float>(squares);
  if (options_.sharded) sum = hooks_.all_reduce(*comms_.dp, sum);
  sum = hooks_.all_reduce(*comms_.pp, sum);
  sum = hooks_.all_reduce(tp, sum);
  return std::sqrt(static_cast<double>(sum));
}

double ShardedOptimizer::ReplicatedSquares() const {
  std::vector<Tensor> grads;
  for (const OptimizerPart& p : parts_) {
    const OptimizedParam& param = params_[p.param];
    if (!param.whole_on_every_tp || param.stage_copy) continue;
    grads.push_back(
        hooks_.gradient(p.layer).Flat(p.begin - layers_[p.layer].opt_begin, {p.end - p.begin}));
  }
  return optim::GradSquaredSum(ops_, grads);
}

void ShardedOptimizer::Step(const StepArgs& args) {
  if (options_.defer) {
    ApplyPending();
    pending_ = Pending{args, std::vector<std::vector<OptimizerPart>>(layers_.size())};
    for (const OptimizerPart& p : parts_) pending_->parts[p.layer].push_back(p);
    DropPendingWhenDone();
  } else if (options_.host_step) {
    HostStep(args);
  } else {
    DeviceStep(args);
  }
}

void ShardedOptimizer::DeviceStep(const StepArgs& args) {
  if (!options_.computes) return;
  for (const OptimizerPart& p : parts_) {
    const int64_t local = p.begin - layers_[p.layer].opt_begin, n = p.end - p.begin;
    const auto [m, v] = hooks_.device_state(p.layer);
    optim::AdamStep(ops_,
                    optim::AdamArgsFor(options_.optimizer, groups_[params_[p.param].group], args.lr,
                                       args.adam_step, args.coef),
                    hooks_.device_params(p.layer).Flat(local, {n}),
                    hooks_.gradient(p.layer).Flat(local, {n}), m.Flat(local, {n}),
                    v.Flat(local, {n}));
  }
}

void ShardedOptimizer::HostStep(const StepArgs& args) {
  if (hooks_.gradients_to_host) hooks_.gradients_to_host();
  // Layers are visited in order: each one's master is acquired when the step reaches it (the
  // next one read ahead) and released when the step moves on.
  const size_t none = layers_.size();
  size_t held = none;
  float* master = nullptr;
  auto master_of = [&](size_t l) {
    if (l == held) return master;
    if (held != none) hooks_.release_master(std::exchange(held, none), /*changed=*/true);
    master = hooks_.acquire_master(l);
    held = l;
    if (hooks_.prefetch_master && l + 1 < layers_.size()) hooks_.prefetch_master(l + 1);
    return master;
  };
  try {
    ForEachRange(
        parts_,
        [&](const OptimizerPart& p, int64_t begin, int64_t end, float* m, float* v) {
          HostRange(p, begin, end, m, v, master_of(p.layer), args);
        },
        /*save=*/true);
  } catch (...) {
    if (held != none) hooks_.release_master(held, /*changed=*/false);
    throw;
  }
  if (held != none) hooks_.release_master(held, /*changed=*/true);
  if (hooks_.flush_masters) hooks_.flush_masters();
}

void ShardedOptimizer::HostRange(const OptimizerPart& p, int64_t begin, int64_t end, float* m,
                                 float* v, float* master, const StepArgs& args) const {
  if (!options_.computes) return;
  const int64_t local = begin - layers_[p.layer].opt_begin;
  optim::AdamStep(optim::AdamArgsFor(options_.optimizer, groups_[params_[p.param].group], args.lr,
                                     args.adam_step, args.coef),
                  master + local, hooks_.host_gradient(p.layer) + local, m, v, end - begin);
}

void ShardedOptimizer::ForEachRange(const std::vector<OptimizerPart>& parts, const PartRange& fn,
                                    bool save, std::optional<size_t> layer) {
  size_t first = 0;  // the first part not wholly in earlier ranges
  const StateRange range = [&](int64_t range_begin, int64_t count, float* m, float* v) {
    const int64_t range_end = range_begin + count;
    for (size_t i = first; i < parts.size(); ++i) {
      const OptimizerPart& p = parts[i];
      const int64_t g0 = std::max(p.global, range_begin);
      const int64_t g1 = std::min(p.global + (p.end - p.begin), range_end);
      if (g0 >= range_end) break;
      if (g0 < g1) {
        fn(p, p.begin + (g0 - p.global), p.begin + (g1 - p.global), m + (g0 - range_begin),
           v + (g0 - range_begin));
      }
      if (g1 == p.global + (p.end - p.begin)) first = i + 1;
    }
  };
  hooks_.walk_state(layer, range, save);
}

void ShardedOptimizer::DropPendingWhenDone() {
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (pending(l)) return;
  }
  pending_.reset();
}

void ShardedOptimizer::StepLayer(size_t l) {
  if (!pending(l)) return;
  const std::vector<OptimizerPart> parts = std::exchange(pending_->parts[l], {});
  float* master = hooks_.acquire_master(l);  // stepped in place, kept on release
  try {
    ForEachRange(
        parts,
        [&](const OptimizerPart& p, int64_t begin, int64_t end, float* m, float* v) {
          HostRange(p, begin, end, m, v, master, pending_->args);
        },
        /*save=*/true, l);
  } catch (...) {
    hooks_.release_master(l, /*changed=*/false);
    throw;
  }
  hooks_.release_master(l, /*changed=*/true);
  if (pending_->zero_grads && hooks_.zero_gradient) hooks_.zero_gradient(l);
  DropPendingWhenDone();
}

void ShardedOptimizer::ApplyPending() {
  for (size_t l = 0; l < layers_.size() && pending_; ++l) {
    if (!pending(l)) continue;
    for (size_t next = l + 1; next < layers_.size(); ++next) {
      if (!pending(next)) continue;
      if (hooks_.prefetch_master) hooks_.prefetch_master(next);
      break;
    }
    StepLayer(l);
  }
  if (hooks_.flush_masters) hooks_.flush_masters();
}

}  // namespace ztrain::zero
