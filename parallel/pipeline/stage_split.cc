#include "parallel/pipeline/stage_split.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "parallel/zero/flat_layout.h"

namespace ztrain::pipeline {
namespace {

// A layer's parameters as the flat layout sees them (only the sizes of the trainable ones
// matter to TiedLayoutSize).
std::vector<zero::FlatParam> FlatParamsOf(const std::vector<StageParam>& params) {
  std::vector<zero::FlatParam> out;
  for (const StageParam& p : params) {
    out.push_back({p.name, p.elements, p.trainable, p.packed, p.tied_to.empty()});
  }
  return out;
}

}  // namespace

StageSplit SplitStages(const std::vector<std::vector<StageParam>>& layers,
                       const std::vector<std::string>& layer_names, int stages, int stage,
                       PartitionMethod method) {
  ZTRAIN_ASSERT(layer_names.size() == layers.size());
  StageSplit split;
  std::vector<int64_t> counts;
  for (const auto& params : layers) {
    int64_t n = 0;
    for (const StageParam& p : params) n += p.elements;
    counts.push_back(n);
  }
  split.bounds = stages == 1 ? std::vector<int>{0, static_cast<int>(layers.size())}
                             : PartitionLayers(counts, stages, method);
  split.begin = static_cast<size_t>(split.bounds[static_cast<size_t>(stage)]);
  split.end = static_cast<size_t>(split.bounds[static_cast<size_t>(stage) + 1]);
  split.min_padded.assign(split.end - split.begin, 0);
  if (stages == 1) return split;
  auto stage_of = [&](size_t l) {
    return static_cast<int>(
               std::upper_bound(split.bounds.begin(), split.bounds.end(), static_cast<int>(l)) -
               split.bounds.begin()) -
           1;
  };
  std::unordered_map<std::string, size_t> owner;
  for (size_t l = 0; l < layers.size(); ++l) {
    for (const StageParam& p : layers[l]) {
      if (p.tied_to.empty()) owner[p.name] = l;
    }
  }
  const size_t begin = split.begin;
  for (size_t l = 0; l < layers.size(); ++l) {
    for (const StageParam& p : layers[l]) {
      auto it = p.tied_to.empty() ? owner.end() : owner.find(p.tied_to);
      if (it == owner.end()) continue;  // untied, or the engine names the missing owner
      if (!p.trainable) continue;       // each stage holds its own frozen copy
      const size_t o = it->second;
      const int so = stage_of(o), sl = stage_of(l);
      if (so == sl) continue;
      for (const StageTie& t : split.ties) {
        ZTRAIN_CHECK(t.layer != l - begin && t.layer != o - begin, "layer ",
                     layer_names[t.layer + begin],
                     " shares more than one weight with other "
                     "pipeline stages; ztrain ties one weight per layer across stages");
      }
      const int64_t size = std::max(zero::TiedLayoutSize(FlatParamsOf(layers[o]), p.tied_to),
                                    zero::TiedLayoutSize(FlatParamsOf(layers[l]), p.name));
      if (sl == stage) {
        split.ties.push_back({l - begin, p.elements, so, /*copy=*/true, p.tied_to});
        split.min_padded[l - begin] = std::max(split.min_padded[l - begin], size);
      }
      if (so == stage) {
        split.ties.push_back({o - begin, p.elements, sl, /*copy=*/false, p.tied_to});
        split.min_padded[o - begin] = std::max(split.min_padded[o - begin], size);
      }
    }
  }
  return split;
}

}  // namespace ztrain::pipeline
