// Note [Checkpoints in the engine] is in trained_state.h.
#include "checkpoint/trained_state.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "core/logging.h"

namespace ztrain::checkpoint {
namespace {

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

void SaveTrainedState(const zero::ParamTable& table, offload::ParamStore& params,
                      zero::ShardedOptimizer& optimizer, const SavingRank& rank,
                      ShardWriter& writer) {
  // Whether this rank saves a part of parameter `s`.
  auto saves = [&](const zero::ParamSlot& s) {
    return (rank.sharded_optimizer || rank.dp_rank == 0) &&
           (s.spec.tp.split() || rank.tp_rank == 0) && !s.stage_copy;
  };
  std::vector<zero::OptimizerPart> parts;
  for (const zero::OptimizerPart& p : optimizer.parts()) {
    if (saves(table.slot(p.param))) parts.push_back(p);
  }
  // fp32 master values, a layer at a time (read from the swap file when on NVMe).
  size_t next = 0;
  for (size_t l = 0; l < table.num_layers(); ++l) {
    const int64_t held_begin = table.Held(l).begin;
    Buffer staged;
    const float* held = params.OpenOnHost(l, staged, MemoryCategory::kWorkspace, true);
    for (; next < parts.size() && parts[next].layer == l; ++next) {
      const zero::OptimizerPart& p = parts[next];
      const zero::ParamSlot& s = table.slot(p.param);
      writer.Add(s.spec.name, Kind::kParam, nn::FullShape(s.spec),
                 WholeRuns(s.spec, p.begin - s.offset, p.end - s.offset),
                 held + (p.begin - held_begin));
    }
  }
  optimizer.ForEachRange(
      parts,
      [&](const zero::OptimizerPart& p, int64_t begin, int64_t end, float* m, float* v) {
        const zero::ParamSlot& s = table.slot(p.param);
        const std::vector<Run> runs = WholeRuns(s.spec, begin - s.offset, end - s.offset);
        writer.Add(s.spec.name, Kind::kExpAvg, nn::FullShape(s.spec), runs, m);
        writer.Add(s.spec.name, Kind::kExpAvgSq, nn::FullShape(s.spec), runs, v);
      },
      /*save=*/false);
}

void LoadTrainedState(const zero::ParamTable& table, offload::ParamStore& params,
                      zero::ShardedOptimizer& optimizer, const ModelIndex& index) {
  // The checkpoint must describe this model: the same parameters with the same whole shapes.
  std::map<std::string, Shape> saved(index.parameters().begin(), index.parameters().end());
  for (const zero::ParamSlot& s : table.slots()) {
    if (s.frozen()) continue;  // not in checkpoints
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
  for (size_t l = 0; l < table.num_layers(); ++l) {
    const int64_t held_begin = table.Held(l).begin;
    Buffer staged;
    float* held = params.OpenOnHost(l, staged, MemoryCategory::kWorkspace, false);
    table.ForEachHeldPart(l, [&](const zero::ParamSlot& s, int64_t begin, int64_t end) {
      read(s.spec, Kind::kParam, begin, end, held + (s.offset + begin - held_begin));
    });
    params.Commit(l, staged);
  }
  params.Flush();
  optimizer.ForEachRange(
      optimizer.parts(),
      [&](const zero::OptimizerPart& p, int64_t begin, int64_t end, float* m, float* v) {
        const zero::ParamSlot& s = table.slot(p.param);
        read(s.spec, Kind::kExpAvg, begin - s.offset, end - s.offset, m);
        read(s.spec, Kind::kExpAvgSq, begin - s.offset, end - s.offset, v);
      },
      /*save=*/true);
  params.RefreshComputeCopies();
}

}  // namespace ztrain::checkpoint
