#pragma once
// What one pipeline stage holds: its layers (PartitionLayers) and the weights it shares with
// another stage, with the least flat size each sharing layer needs (Note [Weights tied across
// stages]).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/pipeline/partition.h"

namespace ztrain::pipeline {

// One parameter of a layer, as the split sees it.
struct StageParam {
  std::string name;
  std::string tied_to;   // the owner's name when this is a tied use, else empty
  int64_t elements = 0;  // its elements (in its local, tensor-parallel shape)
  bool trainable = true;
  bool packed = false;  // follows the previous parameter with no gap (zero::FlatParam)
};

// A weight this stage shares with another stage.
struct StageTie {
  size_t layer = 0;      // the stage's layer holding it (index within the stage), at offset 0
  int64_t elements = 0;  // its size
  int peer = 0;          // the pp rank of the other stage holding it
  bool copy = false;     // this stage holds the copy (the owner sits on `peer`)
  std::string name;      // the tied parameter's (owner's) name
};

struct StageSplit {
  std::vector<int> bounds;  // stage s runs layers [bounds[s], bounds[s + 1])
  std::vector<StageTie> ties;
  std::vector<int64_t> min_padded;  // per layer of the stage: the least flat size (0: any)
  size_t begin = 0, end = 0;        // the stage's layers
};

// Note [Weights tied across stages]
// A trainable weight used on two stages (GPT-2's token embedding, owned by the first layer and
// tied into the LM head on the last stage) is held by both: each stage gets a StageTie for it,
// the later stage's marked as the copy. Both layers place it at offset 0 of their flat buffer
// and must be padded to the same size — the larger of the two layers' zero::TiedLayoutSize —
// so that a dp rank's shard covers the same elements of it on both stages. A frozen tied use
// makes no tie (each stage holds its own frozen copy), and a tied use whose owner no layer
// has is left for the engine to name. A layer may share at most one weight with other
// stages: a second is an error naming the layer (from `layer_names`).
// `layers[l]` are layer l's parameters in order; their element counts drive the partition
// (every parameter counted, tied uses and frozen ones too). With one stage nothing is
// partitioned and nothing is shared.
StageSplit SplitStages(const std::vector<std::vector<StageParam>>& layers,
                       const std::vector<std::string>& layer_names, int stages, int stage,
                       PartitionMethod method);

}  // namespace ztrain::pipeline
