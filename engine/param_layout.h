#pragma once
// Where a layer's own parameters lie in its flat buffer (Engine::BuildStorage): each starts on
// a 16-element (64-byte) boundary, except a packed one (nn::ParamSpec::packed), which follows
// its predecessor with no gap. The pipeline's tie layout and the memory estimate place them
// the same way through this one class.
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/layer.h"

namespace ztrain::detail {

inline constexpr int64_t kParamAlignment = 16;  // elements
// A layer's frozen region (Note [Frozen parameters in the engine]) splits into dp shards of a
// multiple of this many bytes.
inline constexpr int64_t kFrozenAlignment = 64;
inline int64_t AlignUp(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

class ParamPacker {
 public:
  // The offset of the next parameter, `spec`; size() grows past it (aligned).
  int64_t Place(const nn::ParamSpec& spec) { return Place(spec, NumElements(spec.shape)); }
  // The same for a parameter that takes `elements` elements of the buffer (a quantized one's
  // blob, in elements of the compute dtype).
  int64_t Place(const nn::ParamSpec& spec, int64_t elements) {
    const int64_t offset = spec.packed && last_end_ >= 0 ? last_end_ : size_;
    last_end_ = offset + elements;
    size_ = AlignUp(last_end_, kParamAlignment);
    return offset;
  }
  int64_t size() const { return size_; }

 private:
  int64_t size_ = 0;
  int64_t last_end_ = -1;
};

// The flat size of a layer whose parameter `first` (tied across pipeline stages) is stored at
// offset 0 and whose other own parameters follow, placed as BuildStorage places them.
inline int64_t TiedLayoutSize(const std::vector<nn::ParamSpec>& specs, const std::string& first) {
  ParamPacker packer;
  for (const nn::ParamSpec& s : specs) {
    if (s.tied_to.empty() || s.name == first) packer.Place(s);
  }
  return packer.size();
}

}  // namespace ztrain::detail
