#include "nn/layer.h"

namespace ztrain::nn {

void Layer::Bind(std::vector<Tensor> params, std::vector<Tensor> grads) {
  ZTRAIN_ASSERT(params.size() == Params().size() && grads.size() == params.size(),
                "layer ", Name(), " bound with ", params.size(), " tensors");
  params_ = std::move(params);
  grads_ = std::move(grads);
}

void Layer::Decode(const DecodeStep&, const Tensor&, const Tensor&, LayerContext&) {
  throw ConfigError(detail::StrCat("layer ", Name(), " cannot decode incrementally (generation "
                                   "needs the Embedding, TransformerBlock and LmHead layers)"));
}

void ForEachSliceRun(const TensorSlice& slice, const Shape& local_shape,
                     const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const int64_t n = NumElements(local_shape);
  if (!slice.split()) {
    if (n > 0) fn(0, 0, n);
    return;
  }
  const auto rank = static_cast<int>(local_shape.size());
  ZTRAIN_ASSERT(slice.full_shape.size() == local_shape.size() && slice.dim >= 0 &&
                    slice.dim < rank && slice.groups >= 1 && slice.parts >= 1 &&
                    slice.part >= 0 && slice.part < slice.parts,
                "bad tensor slice of ", ShapeToString(slice.full_shape), " as ",
                ShapeToString(local_shape));
  const int64_t full_d = slice.full_shape[static_cast<size_t>(slice.dim)];
  const int64_t local_d = local_shape[static_cast<size_t>(slice.dim)];
  ZTRAIN_ASSERT(full_d == local_d * slice.parts && local_d % slice.groups == 0,
                "slice dimension ", slice.dim, " of ", ShapeToString(slice.full_shape),
                " does not split into ", slice.groups, " x ", slice.parts, " pieces of ",
                ShapeToString(local_shape));
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < slice.dim; ++i) outer *= local_shape[static_cast<size_t>(i)];
  for (int i = slice.dim + 1; i < rank; ++i) inner *= local_shape[static_cast<size_t>(i)];
  const int64_t piece = local_d / slice.groups;  // rows of one block this rank holds
  const int64_t block = full_d / slice.groups;   // rows of one whole block
  int64_t run_local = -1, run_full = -1, run_count = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t g = 0; g < slice.groups; ++g) {
      const int64_t local = (o * local_d + g * piece) * inner;
      const int64_t full = (o * full_d + g * block + slice.part * piece) * inner;
      const int64_t count = piece * inner;
      if (run_count > 0 && run_local + run_count == local && run_full + run_count == full) {
        run_count += count;
        continue;
      }
      if (run_count > 0) fn(run_local, run_full, run_count);
      run_local = local;
      run_full = full;
      run_count = count;
    }
  }
  if (run_count > 0) fn(run_local, run_full, run_count);
}

}  // namespace ztrain::nn
