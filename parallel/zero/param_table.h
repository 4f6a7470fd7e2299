#pragma once
// Note [Parameter table]
// Where each parameter of a pipeline stage lives, decided once as the engine is built: for each
// layer in order, the parameters it declares (Layer::Params) become slots. A parameter the
// layer owns gets one, at the offset zero::LayOut gives it (Note [ZeRO flat layout]) in the
// layer's flat buffer (elements) or, frozen, in its frozen region (bytes: Note [Frozen
// regions]), in the group optim::ParamGroups assigns it (Note [Parameter groups]). A tied use
// (ParamSpec::tied_to) binds its owner's slot, which an earlier layer must declare with the
// same shape. A weight tied across pipeline stages (pipeline::StageTie, Note [Weights tied
// across stages]) sits at offset 0 of both stages' layers, and the stage holding the copy
// stores it under the owner's name (`stage_copy`); a frozen weight tied to one on another
// stage is held as this stage's own frozen copy the same way. Each layer records the slots it
// owns, the slot of each of its Params() in order (`bound`, ties resolved), the layers whose
// buffers hold those (`units`: what stage 3 gathers before it runs), and whether a later
// layer binds one of its parameters (`tie_owner`: its gradients must live through the whole
// backward). The table is pure — no buffers, no communication — and fixed once built: the
// engine allocates, binds, gathers, steps and checkpoints by it.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "nn/layer.h"
#include "optim/param_groups.h"
#include "parallel/pipeline/stage_split.h"
#include "parallel/zero/flat_layout.h"

namespace ztrain::zero {

// One owned parameter: its spec (under the owner's name for a stage copy), its layer (index in
// the stage), its offset in that layer's flat buffer (elements) or frozen region (bytes), and
// its group (index into the ParamGroups).
struct ParamSlot {
  nn::ParamSpec spec;
  size_t layer = 0;
  int64_t offset = 0;
  bool stage_copy = false;  // this stage's copy of a weight another stage owns (pipeline)
  size_t group = 0;
  bool frozen() const { return !spec.trainable; }
};

struct LayerSlots {
  FlatLayout layout;
  std::vector<size_t> owned;  // the slots this layer owns, in its Params() order
  std::vector<size_t> bound;  // the slot of each of its Params() (ties resolved)
  std::vector<size_t> units;  // layers whose buffers hold the bound parameters, no repeats
  bool tie_owner = false;     // a later layer binds one of this layer's parameters
};

class ParamTable {
 public:
  struct Options {
    int dp = 1, rank = 0;              // the data-parallel group the flat buffers split over
    bool shard_optimizer = false;      // ZeRO stage >= 1: the optimizer range is the rank's shard
    bool shard_parameters = false;     // ZeRO stage 3: the rank holds only its shard of a layer
    int64_t frozen_element_bytes = 4;  // the compute dtype's size
    // The bytes a frozen parameter takes in its region (FrozenRegions::Bytes).
    std::function<int64_t(const nn::ParamSpec&)> frozen_bytes;
  };
  // `groups` (not owned) must outlive the table.
  ParamTable(Options options, const optim::ParamGroups& groups);

  // Adds the stage's next layer: `name` (for errors), its Params(), the weight it shares
  // with another stage (or null), and the least flat size it must have (0: any); what it
  // returns stays valid as more layers are added. Throws
  // ztrain::Error for a name used twice, a tie to a parameter no earlier layer declares, or
  // a tie whose shape differs from its owner's.
  const LayerSlots& AddLayer(const std::string& name, std::vector<nn::ParamSpec> params,
                             const pipeline::StageTie* tie, int64_t min_padded);

  // The slot of `name` (a tied name is its owner's); throws ztrain::Error naming it if none.
  const ParamSlot& Find(const std::string& name) const;
  bool Has(const std::string& name) const { return by_name_.count(name) != 0; }
  const std::vector<ParamSlot>& slots() const { return slots_; }
  const ParamSlot& slot(size_t i) const { return slots_[i]; }
  const LayerSlots& layer(size_t l) const { return layers_[l]; }
  size_t num_layers() const { return layers_.size(); }
  // Owned elements (without padding); with `trainable_only` the frozen ones are left out.
  int64_t NumParameters(bool trainable_only = false) const;

  // The elements [begin, begin + count) of layer l's flat buffer this rank holds: the whole
  // layer, or at ZeRO stage 3 its shard.
  struct Range {
    int64_t begin = 0, count = 0;
  };
  Range Held(size_t layer) const;
  // Calls fn(slot, begin, end) for each trained parameter layer l owns that has elements in
  // the held range: its local elements [begin, end) (row-major in its local shape), which sit
  // at slot.offset + begin - Held(l).begin of the held range. In slot order.
  using HeldPartFn = std::function<void(const ParamSlot& slot, int64_t begin, int64_t end)>;
  void ForEachHeldPart(size_t layer, const HeldPartFn& fn) const;

 private:
  std::vector<nn::ParamSpec> StageSpecs(std::vector<nn::ParamSpec> params,
                                        const pipeline::StageTie* tie, std::vector<bool>& copies,
                                        size_t& first) const;

  const Options options_;
  const optim::ParamGroups& groups_;
  std::vector<ParamSlot> slots_;
  std::unordered_map<std::string, size_t> by_name_;
  std::deque<LayerSlots> layers_;  // a deque: a layer's slots stay in place as layers are added
};

}  // namespace ztrain::zero
