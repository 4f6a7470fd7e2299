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

StageModel::StageModel(std::vector<std::unique_ptr<nn::Layer>> model, int stages, int stage,
                       PartitionMethod method)
    : stages_(stages), stage_(stage) {
  std::vector<std::vector<StageParam>> params;
  for (const auto& layer : model) {
    specs_.push_back(layer->Params());
    names_.push_back(layer->Name());
    std::vector<StageParam>& of_layer = params.emplace_back();
    for (const nn::ParamSpec& s : specs_.back()) {
      of_layer.push_back({s.name, s.tied_to, NumElements(s.shape), s.trainable, s.packed});
    }
  }
  split_ =
      SplitStages(params, names_, stages, stage, stages == 1 ? PartitionMethod::kUniform : method);
  for (size_t l = 0; l < model.size(); ++l) {
    if (l < split_.begin) {
      earlier_.push_back(std::move(model[l]));
    } else if (l < split_.end) {
      layers_.push_back(std::move(model[l]));
    }
  }
}

const StageTie* StageModel::TieOf(size_t layer) const {
  for (const StageTie& t : split_.ties) {
    if (t.layer == layer) return &t;
  }
  return nullptr;
}

std::vector<nn::ParamSpec> StageModel::OwnedSpecs() const {
  std::vector<nn::ParamSpec> out;
  for (const auto& specs : specs_) {
    for (const nn::ParamSpec& s : specs) {
      if (s.tied_to.empty()) out.push_back(s);
    }
  }
  return out;
}

std::vector<std::pair<std::string, Shape>> StageModel::Parameters() const {
  std::vector<std::pair<std::string, Shape>> out;
  for (const nn::ParamSpec& s : OwnedSpecs()) out.emplace_back(s.name, nn::FullShape(s));
  return out;
}

Shape StageModel::InputShape(const Shape& tokens) const {
  Shape shape = tokens;
  for (const auto& layer : earlier_) shape = layer->OutputShape(shape);
  return shape;
}

std::string StageModel::Describe() const {
  int64_t n = 0;
  for (size_t l = split_.begin; l < split_.end; ++l) {
    for (const nn::ParamSpec& s : specs_[l]) n += NumElements(s.shape);
  }
  std::string out = "stage ";
  out.append(std::to_string(stage_)).append(" of ").append(std::to_string(stages_));
  out.append(" runs layers ").append(std::to_string(split_.begin)).append("..");
  out.append(std::to_string(split_.end - 1)).append(" (").append(names_[split_.begin]);
  out.append(" .. ").append(names_[split_.end - 1]).append("), ");
  out.append(std::to_string(n)).append(" parameters");
  if (!split_.ties.empty()) out.append(", sharing a tied weight with another stage");
  return out;
}

}  // namespace ztrain::pipeline
