#pragma once
// What one pipeline stage holds: its layers (PartitionLayers) and the weights it shares with
// another stage, with the least flat size each sharing layer needs (Note [Weights tied across
// stages]).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/layer.h"
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

// The whole model as one stage holds it (Note [Pipeline in the engine]): every rank builds the
// whole model as layers (cheap: a layer declares its parameters and owns no storage);
// SplitStages cuts it, and the stage keeps its own layers (TakeLayers, once), the layers
// before them (only for the shape of its input) and the parameter specs of every layer (to
// name and shape what other stages hold).
class StageModel {
 public:
  StageModel(std::vector<std::unique_ptr<nn::Layer>> model, int stages, int stage,
             PartitionMethod method);
  // The stage's layers, moved out (the first call only).
  std::vector<std::unique_ptr<nn::Layer>> TakeLayers() { return std::move(layers_); }
  const StageSplit& split() const { return split_; }
  // The weight stage layer `layer` shares with another stage, or null.
  const StageTie* TieOf(size_t layer) const;
  // Every layer's parameters, the whole model's, in model order.
  const std::vector<std::vector<nn::ParamSpec>>& specs() const { return specs_; }
  // The model's parameters (every stage's, each tied weight once), in model order: their specs
  // (this rank's tensor-parallel slices), and their names with their whole shapes.
  std::vector<nn::ParamSpec> OwnedSpecs() const;
  std::vector<std::pair<std::string, Shape>> Parameters() const;
  // The shape of the stage's input for tokens of shape `tokens` (the tokens' on stage 0).
  Shape InputShape(const Shape& tokens) const;
  // "stage 1 of 2 runs layers 3..5 (h.2 .. lm_head), 1234 parameters, ...": the log line.
  std::string Describe() const;

 private:
  StageSplit split_;
  std::vector<std::vector<nn::ParamSpec>> specs_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<nn::Layer>> earlier_;
  std::vector<std::unique_ptr<nn::Layer>> layers_;
  int stages_ = 1, stage_ = 0;
};

}  // namespace ztrain::pipeline
