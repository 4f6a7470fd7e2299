// Pipeline partitioning (partition.h): stage boundaries over the layer sequence.
//
// kParameters is the classic "linear partition" problem: split a sequence of non-negative
// weights into p contiguous non-empty parts minimising the largest part. The optimum T is the
// smallest value for which a split exists, found by binary search with a greedy test; then
// each boundary is placed as early as possible among the splits whose parts all stay within
// T, which gives the optimal split with the earliest boundaries (lexicographically smallest).
#include "parallel/pipeline/partition.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace ztrain::pipeline {
namespace {

std::vector<int> UniformBounds(int layers, int stages) {
  std::vector<int> bounds{0};
  for (int s = 0; s < stages; ++s) {
    bounds.push_back(bounds.back() + layers / stages + (s < layers % stages ? 1 : 0));
  }
  return bounds;
}

// Splits layer_params by the largest part sum of p contiguous non-empty parts.
class ParameterSplitter {
 public:
  explicit ParameterSplitter(std::span<const int64_t> params) : prefix_(params.size() + 1, 0) {
    std::partial_sum(params.begin(), params.end(), prefix_.begin() + 1);
  }

  std::vector<int> Split(int stages) const {
    const int64_t limit = SmallestLimit(stages);
    std::vector<int> bounds{0};
    for (int s = 1; s < stages; ++s) {
      // The first end that keeps stage s-1 within the limit and lets the stages after it fit;
      // one exists because the limit is feasible and the earlier boundaries kept it so.
      const int begin = bounds.back();
      int end = begin + 1;
      while (!SuffixFits(end, stages - s, limit)) ++end;
      ZTRAIN_ASSERT(Sum(begin, end) <= limit, "partition: stage ", s - 1, " over the limit");
      bounds.push_back(end);
    }
    bounds.push_back(Layers());
    return bounds;
  }

 private:
  int Layers() const { return static_cast<int>(prefix_.size()) - 1; }
  int64_t Sum(int begin, int end) const { return prefix_[end] - prefix_[begin]; }

  // Whether layers [begin, n) split into `parts` non-empty parts of at most `limit` each.
  // Greedy parts that are as long as the limit allows give the fewest; with non-negative sizes
  // any part can be split further, so every count between that and the layer count works too.
  bool SuffixFits(int begin, int parts, int64_t limit) const {
    if (Layers() - begin < parts) return false;
    int needed = 0;
    for (int l = begin; l < Layers(); ++needed) {
      if (Sum(l, l + 1) > limit) return false;
      int end = l + 1;
      while (end < Layers() && Sum(l, end + 1) <= limit) ++end;
      l = end;
    }
    return needed <= parts;
  }

  // The smallest largest-stage sum over all splits into `stages` parts.
  int64_t SmallestLimit(int stages) const {
    int64_t lo = 0, hi = prefix_.back();
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (SuffixFits(0, stages, mid)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }

  std::vector<int64_t> prefix_;  // prefix_[l]: parameters of layers [0, l)
};

}  // namespace

PartitionMethod ParsePartitionMethod(const std::string& name) {
  if (name == "uniform") return PartitionMethod::kUniform;
  if (name == "parameters") return PartitionMethod::kParameters;
  throw Error(detail::StrCat("unknown pipeline partition method \"", name,
                             "\"; use \"uniform\" or \"parameters\""));
}

const char* PartitionMethodName(PartitionMethod method) {
  return method == PartitionMethod::kUniform ? "uniform" : "parameters";
}

std::vector<int> PartitionLayers(std::span<const int64_t> layer_params, int stages,
                                 PartitionMethod method) {
  const int layers = static_cast<int>(layer_params.size());
  ZTRAIN_CHECK(stages >= 1, "pipeline partition: pipeline.stages is ", stages,
               "; it must be at least 1");
  ZTRAIN_CHECK(layers >= stages, "the model has ", layers, " layers but pipeline.stages is ",
               stages, "; every stage needs at least one layer, so use at most ", layers,
               " stages or a model with more layers");
  if (method == PartitionMethod::kUniform) return UniformBounds(layers, stages);
  for (int l = 0; l < layers; ++l) {
    ZTRAIN_CHECK(layer_params[l] >= 0, "pipeline partition: layer ", l, " has ", layer_params[l],
                 " parameters; parameter counts cannot be negative");
  }
  return ParameterSplitter(layer_params).Split(stages);
}

}  // namespace ztrain::pipeline
