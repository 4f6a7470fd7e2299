#include "nn/layer_context.h"

namespace ztrain::nn {

Tensor LayerContext::Save(const std::string& key, DType dtype, const Shape& shape) {
  Buffer buf(*allocator_, dtype, shape, MemoryCategory::kActivations);
  Tensor t = buf.AsTensor(dtype, shape);
  saved_[key] = {std::move(buf), t};
  return t;
}

Tensor LayerContext::Saved(const std::string& key) const {
  auto it = saved_.find(key);
  ZTRAIN_ASSERT(it != saved_.end(), "no activation saved under '", key, "'");
  return it->second.second;
}

Tensor LayerContext::Scratch(DType dtype, const Shape& shape) {
  scratch_.emplace_back(*allocator_, dtype, shape, MemoryCategory::kWorkspace);
  return scratch_.back().AsTensor(dtype, shape);
}

void LayerContext::Release() {
  saved_.clear();
  scratch_.clear();
}

size_t LayerContext::bytes() const {
  size_t n = 0;
  for (const auto& [k, v] : saved_) n += v.first.nbytes();
  for (const auto& b : scratch_) n += b.nbytes();
  return n;
}

}  // namespace ztrain::nn
