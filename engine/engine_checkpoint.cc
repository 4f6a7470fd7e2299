// The engine's part of checkpoints: which elements this rank saves, and restoring the
// elements it holds from a checkpoint written by any layout (checkpoint/checkpoint.h).
//
// Note [Checkpoints in the engine]
// A checkpoint addresses every value by (parameter name, kind, element of the WHOLE
// parameter): the unsharded, unsplit tensor of the single-process model. Each element is
// saved by exactly one rank: the rank whose optimizer range holds it (at ZeRO stage 0 every
// dp rank holds everything, so dp rank 0), the tp rank 0 for parameters that tensor
// parallelism does not split (every tp rank holds them equal), and the owner's stage for a
// weight tied across pipeline stages (the other stage's copy is equal). A rank saves, for
// each parameter part in its optimizer range, the fp32 master values, Adam's m and v, with
// the part's local elements mapped to whole-parameter runs through its tensor-parallel slice
// (nn::ForEachSliceRun). Loading is the reverse for every element the rank holds in its own
// layout (its whole layers at ZeRO 0-2, its shard at 3; m and v for its optimizer range;
// a tied copy too), read from whichever rank file holds it, so dp size, ZeRO stage, offload,
// pp and tp may all differ between the saving and the loading run. The step counter is the
// only other engine state: gradients are zero between steps, the lr schedule is a function
// of the step. Swapped-out state streams through the swappers a layer (parameters) or a tile
// (optimizer state) at a time.
#include <algorithm>

#include "checkpoint/checkpoint.h"
#include "engine/engine.h"
#include "engine/engine_state.h"

namespace ztrain {
namespace {

using checkpoint::Kind;
using checkpoint::Run;

// The whole-parameter runs of a parameter's local elements [a, b), in local order.
std::vector<Run> WholeRuns(const nn::ParamSpec& spec, int64_t a, int64_t b) {
  std::vector<Run> runs;
  nn::ForEachSliceRun(spec.tp, spec.shape, [&](int64_t local, int64_t full, int64_t n) {
    const int64_t x = std::max(a, local), y = std::min(b, local + n);
    if (x < y) runs.push_back({full + (x - local), y - x});
  });
  return runs;
}

}  // namespace

void Engine::SaveState(checkpoint::ShardWriter& writer) {
  optimizer_->ApplyPending();  // Note [Deferred optimizer step]
  // Whether this rank saves part `p` (Note [Checkpoints in the engine]).
  auto saves = [&](const Slot& s) {
    return (zero_.shard_optimizer || dp_->rank() == 0) && (s.spec.tp.split() || tp_->rank() == 0) &&
           !s.stage_copy;
  };
  std::vector<zero::OptimizerPart> parts;
  for (const zero::OptimizerPart& p : optimizer_->parts()) {
    if (saves(table_->slot(p.param))) parts.push_back(p);
  }
  // fp32 master values, a layer at a time (read from the swap file when on NVMe).
  size_t next = 0;
  for (size_t l = 0; l < states_.size(); ++l) {
    const int64_t held_begin = table_->Held(l).begin;
    Buffer staged;
    const float* held = held_->OpenOnHost(l, staged, MemoryCategory::kWorkspace, true);
    for (; next < parts.size() && parts[next].layer == l; ++next) {
      const zero::OptimizerPart& p = parts[next];
      const Slot& s = table_->slot(p.param);
      writer.Add(s.spec.name, Kind::kParam, nn::FullShape(s.spec),
                 WholeRuns(s.spec, p.begin - s.offset, p.end - s.offset),
                 held + (p.begin - held_begin));
    }
  }
  optimizer_->ForEachRange(
      parts,
      [&](const zero::OptimizerPart& p, int64_t begin, int64_t end, float* m, float* v) {
        const Slot& s = table_->slot(p.param);
        const std::vector<Run> runs = WholeRuns(s.spec, begin - s.offset, end - s.offset);
        writer.Add(s.spec.name, Kind::kExpAvg, nn::FullShape(s.spec), runs, m);
        writer.Add(s.spec.name, Kind::kExpAvgSq, nn::FullShape(s.spec), runs, v);
      },
      /*save=*/false);
}

void Engine::LoadState(const checkpoint::ModelIndex& index, int64_t step) {
  optimizer_->ApplyPending();  // Note [Deferred optimizer step]
  // The checkpoint must describe this model: the same parameters with the same whole shapes.
  std::map<std::string, Shape> saved(index.parameters().begin(), index.parameters().end());
  for (const Slot& s : table_->slots()) {
    if (s.frozen()) continue;  // not in checkpoints (Note [Frozen regions])
    auto it = saved.find(s.spec.name);
    ZTRAIN_CHECK(it != saved.end(), "the checkpoint has no parameter '", s.spec.name,
                 "': it was saved from another model");
    ZTRAIN_CHECK(it->second == nn::FullShape(s.spec), "parameter '", s.spec.name, "' is ",
                 ShapeToString(it->second), " in the checkpoint but ",
                 ShapeToString(nn::FullShape(s.spec)), " in this model (model.* differs)");
  }
  // Reads a parameter's local elements [a, b) of `kind` into out (local order).
  auto read = [&](const nn::ParamSpec& spec, Kind kind, int64_t a, int64_t b, float* out) {
    for (const Run& r : WholeRuns(spec, a, b)) {
      index.Read(spec.name, kind, r.begin, r.count, out);
      out += r.count;
    }
  };
  for (size_t l = 0; l < states_.size(); ++l) {
    const int64_t held_begin = table_->Held(l).begin;
    Buffer staged;
    float* held = held_->OpenOnHost(l, staged, MemoryCategory::kWorkspace, false);
    table_->ForEachHeldPart(l, [&](const Slot& s, int64_t begin, int64_t end) {
      read(s.spec, Kind::kParam, begin, end, held + (s.offset + begin - held_begin));
    });
    held_->Commit(l, staged);
  }
  held_->Flush();
  optimizer_->ForEachRange(
      optimizer_->parts(),
      [&](const zero::OptimizerPart& p, int64_t begin, int64_t end, float* m, float* v) {
        const Slot& s = table_->slot(p.param);
        read(s.spec, Kind::kExpAvg, begin - s.offset, end - s.offset, m);
        read(s.spec, Kind::kExpAvgSq, begin - s.offset, end - s.offset, v);
      },
      /*save=*/true);
  step_ = step;
  held_->RefreshComputeCopies();
}

}  // namespace ztrain
