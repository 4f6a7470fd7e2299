#pragma once
// Note [Sharded optimizer]
// ZeRO's optimizer on one rank (Note [ZeRO in the engine], engine/engine_state.h, has the
// whole story; this is its optimizer part):
//   - the parts: each trained parameter's elements inside its layer's optimizer range
//     (zero::LayOut's opt_begin + [0, opt_len): the whole layer at stage 0, the rank's shard
//     at stages 1-3), in model order, each with its index in the rank's optimizer state —
//     the layers' ranges concatenated, which is where NVMe keeps m and v. Made once, when
//     the optimizer is built (PartsOf is the pure function).
//   - the norm: the L2 norm of the reduced gradients over all groups, each element counted
//     once: a pipeline stage's copy of a weight another stage owns is left out, a parameter
//     whole on every tp rank counts 1/tp on each, and the squares are summed over the dp
//     group (when the state is sharded), the pp group and the tp group. With none of these
//     the norm is taken in double on the host, never rounded through a float.
//   - the step: AdamW on every part with its group's settings (optim::AdamArgsFor): on the
//     device over tensor views, or on the host over the fp32 master of each layer's range,
//     m and v walked range by range as the state hook hands them over (a layer at a time in
//     memory, the swapper's tiles on NVMe; a part split between two tiles is stepped in two
//     pieces, which AdamW's elementwise arithmetic makes the same).
//   - the deferred step (Note [Deferred optimizer step], engine/engine_optimizer.cc): with
//     Options::defer, Step only records its arguments and every layer with parts becomes
//     pending; StepLayer(l) steps one pending layer (when its shard is next read) and
//     ApplyPending all of them. Each element gets the same operands as when stepped at once.
// Where a shard, its master, its gradients, m and v live is the caller's (OptimizerHooks):
// the optimizer owns the parts and the pending step, nothing else.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "optim/param_groups.h"
#include "parallel/comm/communicator.h"
#include "parallel/zero/param_table.h"

namespace ztrain::zero {

// One layer's optimizer range in its flat buffer (FlatLayout's).
struct OptimizedLayer {
  int64_t opt_begin = 0, opt_len = 0;
  // Leading elements of the flat buffer that are this pipeline stage's copy of a weight
  // another stage owns (0: none): left out of the norm.
  int64_t leading_copy = 0;
};

// One parameter in a layer's flat buffer, as the optimizer sees it.
struct OptimizedParam {
  size_t layer = 0;
  int64_t offset = 0, elements = 0;
  size_t group = 0;                // in the optimizer's optim::ParamGroups
  bool trained = true;             // false: frozen, no part
  bool whole_on_every_tp = false;  // tensor parallelism does not split it
  bool stage_copy = false;         // a pipeline stage's copy of a weight another stage owns
};

// A parameter's elements [begin, end) (in its layer's flat buffer) inside the layer's
// optimizer range; `global` is the index of `begin` in the rank's optimizer state.
struct OptimizerPart {
  size_t param = 0;  // into the params the optimizer was built with
  size_t layer = 0;
  int64_t begin = 0, end = 0;
  int64_t global = 0;
};

// What the optimizer sees of a parameter table (Note [Parameter table]): each layer's
// optimizer range (a trained stage copy, which sits at offset 0, leading), and each slot as a
// parameter, in slot order.
std::vector<OptimizedLayer> OptimizedLayersOf(const ParamTable& table);
std::vector<OptimizedParam> OptimizedParamsOf(const ParamTable& table);

// The parts of `params` in the ranges of `layers`, in the order of `params`.
std::vector<OptimizerPart> PartsOf(const std::vector<OptimizedLayer>& layers,
                                   const std::vector<OptimizedParam>& params);

// One step's arguments: the learning rate (before the group's scale), the clip (and
// loss-scale) coefficient, and Adam's 1-based update count (bias correction).
struct StepArgs {
  double lr = 0.0;
  float coef = 1.0f;
  int64_t adam_step = 1;
};

// fn(global_begin, count, m, v): m and v of the optimizer state's elements
// [global_begin, global_begin + count), on the host.
using StateRange = std::function<void(int64_t global_begin, int64_t count, float* m, float* v)>;

struct OptimizerHooks {
  // Layer l's reduced fp32 gradients over its optimizer range (opt_len elements), where they
  // are (the device's memory or the host's).
  std::function<Tensor(size_t l)> gradient;
  // Calls fn over the optimizer state of layer l (every layer when nullopt) in order, in
  // ranges that cover it; what fn writes is kept when `save`.
  std::function<void(std::optional<size_t> l, const StateRange& fn, bool save)> walk_state;
  // `value` summed over `group` (a collective).
  std::function<float(comm::Communicator& group, float value)> all_reduce;

  // The host step (Options::host_step):
  // Layer l's reduced gradient range on the host (opt_len elements).
  std::function<const float*(size_t l)> host_gradient;
  // Before a host step: bring every layer's reduced gradients to the host (optional).
  std::function<void()> gradients_to_host;
  // The fp32 master of layer l's optimizer range on the host, to step in place until
  // release_master(l, changed); with `changed` the caller keeps what was written (writes it
  // back, copies it to the device). One layer at a time.
  std::function<float*(size_t l)> acquire_master;
  std::function<void(size_t l, bool changed)> release_master;
  // Layer l's master will be acquired soon: start reading it (optional). flush_masters waits
  // for every write-back (optional).
  std::function<void(size_t l)> prefetch_master;
  std::function<void()> flush_masters;

  // The device step (no host_step): layer l's fp32 parameters over its optimizer range, and
  // its m and v (opt_len elements each), on the device.
  std::function<Tensor(size_t l)> device_params;
  std::function<std::pair<Tensor, Tensor>(size_t l)> device_state;

  // The deferred step: a pending layer was stepped after the gradients were zeroed
  // (GradientsZeroed), so its gradients may go now.
  std::function<void(size_t l)> zero_gradient;
};

class ShardedOptimizer {
 public:
  struct Options {
    OptimizerConfig optimizer;   // AdamW's settings
    bool host_step = true;       // AdamW on the host (else on the device, through ops)
    bool defer = false;          // Note [Deferred optimizer step]: host_step only
    bool computes = true;        // false: shape-only, no arithmetic; the collectives still run
    bool host_gradients = true;  // the reduced gradients are host memory (the CPU backend)
    bool sharded = false;        // the state is sharded over dp (ZeRO stage >= 1)
  };
  // The groups the norm is summed over; they must outlive the optimizer.
  struct Groups {
    comm::Communicator* dp = nullptr;
    comm::Communicator* pp = nullptr;
    comm::Communicator* tp = nullptr;
  };
  ShardedOptimizer(Options options, optim::ParamGroups groups, std::vector<OptimizedLayer> layers,
                   std::vector<OptimizedParam> params, Groups comms, kernels::Ops& ops,
                   OptimizerHooks hooks);

  // Every part, in model order.
  const std::vector<OptimizerPart>& parts() const { return parts_; }
  // Layer l's first element in the rank's optimizer state.
  int64_t base(size_t l) const { return base_[l]; }

  // The global norm of the reduced gradients (collective over the groups).
  double GradNorm();
  // One AdamW step over every part (recorded only, with Options::defer).
  void Step(const StepArgs& args);

  // Calls fn(part, begin, end, m, v) over `parts` (a subset of parts(), in order), [begin,
  // end) a range of the part and m, v its Adam state on the host; what fn writes is kept
  // when `save`. With `layer` the parts are that layer's and only its state is walked.
  using PartRange = std::function<void(const OptimizerPart& part, int64_t begin, int64_t end,
                                       float* m, float* v)>;
  void ForEachRange(const std::vector<OptimizerPart>& parts, const PartRange& fn, bool save,
                    std::optional<size_t> layer = std::nullopt);

  // The deferred step: whether layer l (any layer) is still to be stepped; stepping layer l
  // if it is; stepping every pending layer (reading each next one ahead); and telling the
  // optimizer the gradients were zeroed, so a pending layer's go once it is stepped.
  bool pending(size_t l) const { return pending_ && !pending_->parts[l].empty(); }
  bool any_pending() const { return pending_.has_value(); }
  void StepLayer(size_t l);
  void ApplyPending();
  void GradientsZeroed() {
    if (pending_) pending_->zero_grads = true;
  }

 private:
  void DeviceStep(const StepArgs& args);
  void HostStep(const StepArgs& args);
  // AdamW on elements [begin, end) of a part, with their m and v; `master` is the fp32
  // master of the part's layer's optimizer range.
  void HostRange(const OptimizerPart& p, int64_t begin, int64_t end, float* m, float* v,
                 float* master, const StepArgs& args) const;
  // The squared gradients of the parts whole on every tp rank (stage copies left out).
  double ReplicatedSquares() const;
  void DropPendingWhenDone();

  const Options options_;
  const optim::ParamGroups groups_;
  const std::vector<OptimizedLayer> layers_;
  const std::vector<OptimizedParam> params_;
  const Groups comms_;
  kernels::Ops& ops_;
  const OptimizerHooks hooks_;
  std::vector<OptimizerPart> parts_;
  std::vector<int64_t> base_;
  struct Pending {
    StepArgs args;
    std::vector<std::vector<OptimizerPart>> parts;  // per layer, those still to be stepped
    bool zero_grads = false;  // GradientsZeroed since: a layer's gradients go once stepped
  };
  std::optional<Pending> pending_;  // null when no layer has parts left
};

}  // namespace ztrain::zero
