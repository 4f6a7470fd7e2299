#pragma once
// The communication of one data-parallel train step, replayed without the compute, for
// bench/dp_bench: what the engine would spend communicating if nothing overlapped or slowed it.
//
// LayoutOf lays out the engine's per-layer flat buffers from the layers alone, as the engine
// does (Note [ZeRO flat layout], parallel/zero/flat_layout.h); StepCollectives issues the
// collectives a TrainStep with one micro-batch issues at a ZeRO stage, in the engine's order, on
// the given communicator. The bench checks the bytes they move against the engine's own step, so a
// change in the engine shows as a mismatch rather than as a wrong figure. StepCollectives owns fp32
// buffers as large as the layers (gradients, and at stages 1-3 parameters and both shards); it is
// used from one thread, collectively on every rank, and throws what the communicator throws.
#include <cstdint>
#include <vector>

#include "bench/bench_util.h"
#include "core/config.h"
#include "engine/engine.h"
#include "parallel/comm/communicator.h"
#include "parallel/zero/gather_plan.h"

namespace ztrain::bench {

struct LayerLayout {
  std::vector<int64_t> padded;       // each layer's flat buffer, elements
  std::vector<zero::UnitUse> units;  // the layers whose buffers each layer reads
};

// Owned parameters aligned to 16 elements, each layer padded to a multiple of 16 x dp; a
// layer reads its own buffer and those of the layers it ties parameters to.
LayerLayout LayoutOf(const Engine& engine, int dp);

// How many gradient buckets one backward launches: the engine closes a bucket once it holds
// reduce_bucket_size elements, and at layer 0.
int CountBuckets(const LayerLayout& layout, int64_t bucket_size);

// Stage 0: each layer's gradients are all-reduced as backward finishes it (last layer first);
// stages 1-3 reduce-scatter them instead (all-reduce when reduce_scatter is off). Then the
// loss mean and, at stages 1-3, the gradient norm (the engine waits for everything before
// each). Stages 1 and 2 then all-gather every updated shard; stage 3 instead gathers
// parameters before use, as zero::PlanGathers plans them for forward and backward.
class StepCollectives {
 public:
  StepCollectives(const LayerLayout& layout, const ZeroConfig& zero, comm::Communicator& dp);
  // Issues one step's collectives and waits for them all.
  void Run();

 private:
  comm::WorkPtr ReduceGradients(size_t layer);
  void Gather(const std::vector<size_t>& layers);
  void WaitAll();
  void Scalar();

  ZeroConfig zero_;
  comm::Communicator& dp_;
  std::vector<FloatArray> grads_, params_, grad_shards_, param_shards_;
  zero::GatherPlan plan_;
  std::vector<comm::WorkPtr> works_;
};

}  // namespace ztrain::bench
