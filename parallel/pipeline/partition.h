#pragma once
// Pipeline partitioning: which contiguous range of layers each stage owns (DeepSpeed's
// PipelineModule partition_method "uniform" and "parameters").
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ztrain::pipeline {

enum class PartitionMethod { kUniform, kParameters };
// "uniform" | "parameters"; throws ztrain::Error naming them for any other name.
PartitionMethod ParsePartitionMethod(const std::string& name);
const char* PartitionMethodName(PartitionMethod method);

// Stage boundaries: a vector of stages + 1 layer indices, bounds[0] = 0, bounds[stages] =
// layer count, stage s owning layers [bounds[s], bounds[s+1]); every stage gets at least one
// layer.
//   kUniform     layer counts differ by at most one (the earlier stages get the extra ones);
//   kParameters  the largest stage's parameter count is as small as it can be (exact, over
//                all contiguous partitions); ties broken toward earlier boundaries.
// `layer_params[l]` is layer l's parameter count (may be 0). Throws ztrain::Error when there
// are fewer layers than stages ("the model has 6 layers but pipeline.stages is 8; ...").
std::vector<int> PartitionLayers(std::span<const int64_t> layer_params, int stages,
                                 PartitionMethod method);

}  // namespace ztrain::pipeline
