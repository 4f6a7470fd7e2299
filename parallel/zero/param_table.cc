// Note [Parameter table] is in param_table.h.
#include "parallel/zero/param_table.h"

#include <algorithm>
#include <utility>

#include "core/logging.h"

namespace ztrain::zero {

ParamTable::ParamTable(Options options, const optim::ParamGroups& groups)
    : options_(std::move(options)), groups_(groups) {}

// The layer's parameters as this stage holds them: a weight tied across pipeline stages sits
// at offset 0 in both stages' layers (`first`, or none: params.size()), and the stage holding
// the copy stores it under the owner's name (`copies`).
std::vector<nn::ParamSpec> ParamTable::StageSpecs(std::vector<nn::ParamSpec> specs,
                                                  const pipeline::StageTie* tie,
                                                  std::vector<bool>& copies, size_t& first) const {
  first = specs.size();
  copies.assign(specs.size(), false);
  for (size_t i = 0; i < specs.size(); ++i) {
    nn::ParamSpec& spec = specs[i];
    // A frozen weight tied to another stage's needs nothing kept equal: this stage holds
    // its own frozen copy (Note [Frozen regions]).
    const bool frozen_copy = !spec.trainable && !spec.tied_to.empty() && !Has(spec.tied_to);
    if ((tie && tie->copy && spec.tied_to == tie->name) || frozen_copy) {
      spec.name = spec.tied_to;
      spec.tied_to.clear();
      copies[i] = true;
    }
    if (tie && spec.tied_to.empty() && spec.name == tie->name) first = i;
  }
  return specs;
}

const LayerSlots& ParamTable::AddLayer(const std::string& name, std::vector<nn::ParamSpec> params,
                                       const pipeline::StageTie* tie, int64_t min_padded) {
  const size_t l = layers_.size();
  std::vector<bool> copies;
  size_t first = 0;
  const std::vector<nn::ParamSpec> specs = StageSpecs(std::move(params), tie, copies, first);
  // Trainable parameters in elements of the flat buffers, frozen ones in elements of the
  // compute dtype in the frozen region (a quantized one's blob too: a multiple of 4 bytes).
  std::vector<FlatParam> flat;
  for (const nn::ParamSpec& spec : specs) {
    ZTRAIN_CHECK(!spec.tied_to.empty() || !Has(spec.name), "parameter name '", spec.name,
                 "' is used twice; parameter names must be unique in the model");
    flat.push_back({spec.name,
                    spec.trainable ? NumElements(spec.shape)
                                   : options_.frozen_bytes(spec) / options_.frozen_element_bytes,
                    spec.trainable, spec.packed, spec.tied_to.empty()});
  }
  FlatLayoutOptions o;
  o.dp = options_.dp;
  o.rank = options_.rank;
  o.shard_optimizer = options_.shard_optimizer;
  o.first = first;
  o.min_padded = min_padded;
  o.frozen_element_bytes = options_.frozen_element_bytes;
  LayerSlots& layer = layers_.emplace_back();
  layer.layout = LayOut(flat, o);
  // Each owned parameter gets a slot (at its layout offset, in its group), a tied one binds
  // its owner's, and the layer records which layers' buffers it binds.
  for (size_t i = 0; i < specs.size(); ++i) {
    const nn::ParamSpec& spec = specs[i];
    size_t slot = slots_.size();
    if (layer.layout.offsets[i] < 0) {
      auto it = by_name_.find(spec.tied_to);
      ZTRAIN_CHECK(it != by_name_.end(), "layer ", name, " ties '", spec.name, "' to '",
                   spec.tied_to, "', which no earlier layer declares");
      const ParamSlot& owner = slots_[it->second];
      ZTRAIN_CHECK(owner.spec.shape == spec.shape, "tied parameter '", spec.name, "' has shape ",
                   ShapeToString(spec.shape), " but '", spec.tied_to, "' has ",
                   ShapeToString(owner.spec.shape));
      slot = it->second;
      layers_[owner.layer].tie_owner = true;
    } else {
      by_name_[spec.name] = slot;
      layer.owned.push_back(slot);
      slots_.push_back({spec, l, layer.layout.offsets[i], copies[i],
                        groups_.Assign(spec.name, spec.shape.size(), spec.trainable)});
    }
    layer.bound.push_back(slot);
    const size_t unit = slots_[slot].layer;
    if (std::find(layer.units.begin(), layer.units.end(), unit) == layer.units.end()) {
      layer.units.push_back(unit);
    }
  }
  return layer;
}

const ParamSlot& ParamTable::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  ZTRAIN_CHECK(it != by_name_.end(), "no parameter named '", name, "'");
  return slots_[it->second];
}

ParamTable::Range ParamTable::Held(size_t l) const {
  const FlatLayout& layout = layers_[l].layout;
  if (options_.shard_parameters) return {layout.opt_begin, layout.shard};
  return {0, layout.padded};
}

void ParamTable::ForEachHeldPart(size_t l, const HeldPartFn& fn) const {
  const Range held = Held(l);
  for (size_t slot : layers_[l].owned) {
    const ParamSlot& s = slots_[slot];
    if (s.frozen()) continue;
    const int64_t begin = std::max(s.offset, held.begin) - s.offset;
    const int64_t end =
        std::min(s.offset + NumElements(s.spec.shape), held.begin + held.count) - s.offset;
    if (begin < end) fn(s, begin, end);
  }
}

int64_t ParamTable::NumParameters(bool trainable_only) const {
  int64_t n = 0;
  for (const ParamSlot& s : slots_)
    n += trainable_only && s.frozen() ? 0 : NumElements(s.spec.shape);
  return n;
}

}  // namespace ztrain::zero
