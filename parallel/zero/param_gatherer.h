#pragma once
// Note [Parameter gatherer]
// ZeRO stage 3's parameter gathering as it runs (Note [ZeRO in the engine],
// engine/engine_state.h, has the whole story): it executes the zero::PlanGathers plan
// (gather_plan.h) of a step through two hooks around each position, a layer's forward or its
// backward (whose recomputation runs inside it):
//   - BeforeLayer(l) launches the gathers the plan fetches at this position — a unit's
//     trained parameters, `elements` of the compute dtype, and its frozen region of
//     `frozen_bytes`, each into a whole buffer the gatherer allocates (with launch_at_use, a
//     unit layer l does not need is only allocated, and launched when a layer needs it) —
//     then lets the source read ahead the shards of the next `read_ahead` planned gathers
//     (NVMe), then waits for the gathers of the units layer l needs;
//   - AfterLayer() releases what the plan releases after this position, and moves on.
// Start(phases) begins a step, releasing anything an earlier, failed step left gathered; the
// plan of each phase list is made once and kept. Whole(u) and FrozenWhole(u) are a unit's
// gathered buffers (empty while it is not gathered): what the caller binds the layer's
// parameter views to.
// The gatherer owns the gathered buffers and the work in flight, nothing else: where a shard
// lives and how it reaches the collective is the source's business (GatherHooks).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "core/allocator.h"
#include "core/buffer.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "parallel/comm/communicator.h"
#include "parallel/zero/gather_plan.h"

namespace ztrain::zero {

// One layer's flat buffers as gathered.
struct GatherUnit {
  int64_t elements = 0;      // trained parameters, padded (0: none)
  int64_t frozen_bytes = 0;  // the frozen region, padded (0: none)
  UnitUse needs;             // the units whose buffers the layer binds, itself included
};

struct GatherHooks {
  // Launches the all-gather of unit u's trained shard into `whole` (`elements` of the compute
  // dtype), and of its frozen shard into `whole` (`frozen_bytes`).
  std::function<comm::WorkPtr(size_t u, const Buffer& whole)> gather;
  std::function<comm::WorkPtr(size_t u, const Buffer& whole)> gather_frozen;
  // Unit u's trained shard will be gathered soon: start reading it (optional).
  std::function<void(size_t u)> read_ahead;
  // Waits for one gather (the engine's WaitFor, which times it); unset: Work::Wait.
  std::function<void(comm::Work&)> wait;
};

class ParamGatherer {
 public:
  struct Options {
    DType dtype = DType::kF32;  // the compute dtype the trained parameters are gathered in
    GatherLimits limits;
    int read_ahead = 0;  // planned gathers whose shards the source reads ahead
    // Read ahead past the plan's end into its start, as if the next step ran the same plan
    // (when the shards do not change between steps).
    bool read_ahead_wraps = false;
    // Launch a prefetched unit's gathers only when a layer needs it (its buffers are still
    // allocated where the plan fetches it): for a source whose launch does work best done
    // beside the compute of the layers before (Note [Deferred optimizer step]).
    bool launch_at_use = false;
  };
  // `memory` gives the gathered buffers (MemoryCategory::kParameters).
  ParamGatherer(Options options, std::vector<GatherUnit> units, Allocator& memory,
                GatherHooks hooks);
  // Waits for the gathers in flight (they write into the gatherer's buffers), reporting no
  // error: those were or will be reported elsewhere.
  ~ParamGatherer();
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  // Begins a step whose phases run in this order: per micro-batch its forward (false) and,
  // when it trains, its backward (true); forward visits the layers 0..n-1, backward n-1..0.
  void Start(const std::vector<bool>& phases);
  // `micro_batches` forwards, each followed by its backward when `backward`.
  void Start(int micro_batches, bool backward);
  void BeforeLayer(size_t l);
  void AfterLayer();
  // Waits for every gather in flight and drops every gathered buffer (after an error left a
  // plan half done). Start does it too.
  void ReleaseAll();

  const Buffer& Whole(size_t u) const { return units_[u].whole; }
  const Buffer& FrozenWhole(size_t u) const { return units_[u].frozen_whole; }
  // The plan running, or null between steps.
  const GatherPlan* plan() const { return plan_; }

 private:
  struct Unit {
    GatherUnit spec;
    Buffer whole, frozen_whole;
    comm::WorkPtr work, frozen_work;
    bool unlaunched = false;  // launch_at_use: allocated, its gathers not launched yet
  };
  void Launch(size_t u);
  void ReadAhead();
  void Wait(comm::WorkPtr& work);

  const Options options_;
  Allocator& memory_;
  const GatherHooks hooks_;
  std::vector<Unit> units_;
  std::map<std::vector<bool>, GatherPlan> plans_;
  const GatherPlan* plan_ = nullptr;
  size_t position_ = 0;
  std::vector<size_t> layer_at_;  // the layer of each position of the running plan
};

// Note [Offloaded shards beside compute]: with offload_param on a GPU the shard is host memory:
// the fp32 master, or under mixed precision its compute-dtype copy (the parameter store's
// compute copy), refreshed with the master, so the gather moves 2 bytes a parameter over PCIe
// (DeepSpeed keeps the same 16-bit copy on the host). The copy to this rank's chunk of the
// gathered buffer runs beside the ops, so the copy for a layer the plan prefetches runs while
// the layer before it computes. Across ranks the all-gather takes the host shard itself and
// copies it on the group's stream before gathering (communicator.h), where NCCL orders it
// after the ops issued before it; the gatherer waits for the whole gather as for any other.
// On one rank there is nothing to gather: the copy goes beside the ops (Ops::CopyBeside), the
// gather's Work is its ticket, and waiting for it makes the layer's ops wait on the device,
// not the host. A frozen base offloaded to the host (LoRA) is gathered the same way
// (zero::FrozenRegions).
// GatherHostShard launches that gather of `shard` (host memory) into `out` (device memory),
// `mine` being this rank's chunk of `out`. A gather of one rank dropped unwaited (after an
// error) still orders the freeing of its buffers after the copy.
comm::WorkPtr GatherHostShard(comm::Communicator& dp, kernels::Ops& ops, const Tensor& shard,
                              const Tensor& mine, const Tensor& out);

// Stages 1 and 2, after the optimizer step: every layer's updated shard all-gathered back into
// its whole fp32 parameters `wholes[l]` (padded; empty: a layer with none), this rank's shard
// being [rank x shard, (rank + 1) x shard) of it, with at most `bucket_elements` gathered
// elements in flight (allgather_bucket_size). Each shard is sent from a copy (the gathered
// output covers it too) from `memory`. Collective over `dp`.
void GatherUpdatedShards(const std::vector<Tensor>& wholes, comm::Communicator& dp,
                         kernels::Ops& ops, Allocator& memory, int64_t bucket_elements,
                         const std::function<void(comm::Work&)>& wait);

}  // namespace ztrain::zero
