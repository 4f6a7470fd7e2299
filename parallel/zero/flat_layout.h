#pragma once
// Note [ZeRO flat layout]
// Each layer keeps its trainable parameters in one flat buffer (and its gradients, m and v in
// buffers that mirror it), and its frozen ones in a byte region of the compute dtype. LayOut
// decides where everything lies, as a pure function of the layer's parameters, the
// data-parallel size and rank and whether the optimizer state is sharded:
//   - each trainable parameter starts on a 16-element (64-byte) boundary, except a packed one
//     (q, k and v of one GEMM), which follows its predecessor with no gap; a parameter tied
//     to an earlier layer's takes no place; one parameter may be asked to come first (the
//     weight a pipeline stage shares with another, at offset 0 in both stages);
//   - the buffer is padded to a multiple of dp x 16 elements (and at least `min_padded`), so
//     it splits into dp equal shards; rank r's shard is [r x shard, (r + 1) x shard);
//   - the frozen region is padded to a multiple of dp x 64 bytes, in equal shards the same way;
//   - the optimizer range is the whole buffer without sharding (ZeRO stage 0) and the rank's
//     shard with it (stages 1-3).
// Padding holds zeros and stays zero. The engine allocates by this layout, the memory
// estimate counts by it and the collective benches size their buffers by it, so the three
// cannot disagree.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ztrain::zero {

inline constexpr int64_t kParamAlignment = 16;   // elements
inline constexpr int64_t kFrozenAlignment = 64;  // bytes, per dp shard of a frozen region
inline int64_t AlignUp(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// Places parameters one after another on kParamAlignment boundaries (a packed one right after
// its predecessor).
class ParamPacker {
 public:
  // The offset of the next parameter, of `elements` elements; size() grows past it (aligned).
  int64_t Place(int64_t elements, bool packed) {
    const int64_t offset = packed && last_end_ >= 0 ? last_end_ : size_;
    last_end_ = offset + elements;
    size_ = AlignUp(last_end_, kParamAlignment);
    return offset;
  }
  int64_t size() const { return size_; }

 private:
  int64_t size_ = 0;
  int64_t last_end_ = -1;
};

// One of a layer's parameters, as the layout sees it.
struct FlatParam {
  std::string name;       // for errors
  int64_t elements = 0;   // trainable: fp32 elements; frozen: compute-dtype elements it takes
  bool trainable = true;  // false: in the frozen region
  bool packed = false;    // follows the previous parameter with no gap (same kind, owned)
  bool owned = true;      // false: tied to an earlier layer's parameter, no place here
};

struct FlatLayoutOptions {
  int dp = 1;                              // data-parallel size
  int rank = 0;                            // this rank's place in it
  bool shard_optimizer = false;            // ZeRO stage >= 1
  size_t first = static_cast<size_t>(-1);  // the parameter placed at offset 0, if any
  int64_t min_padded = 0;                  // the least flat size (a layout shared across stages)
  int64_t frozen_element_bytes = 4;        // the compute dtype's size
};

struct FlatLayout {
  // Per parameter: elements into the flat buffer (trainable), bytes into the frozen region
  // (frozen), or -1 (not owned).
  std::vector<int64_t> offsets;
  int64_t padded = 0, shard = 0;                // flat buffer elements; padded = dp x shard
  int64_t frozen_padded = 0, frozen_shard = 0;  // frozen region bytes; the same split
  int64_t opt_begin = 0, opt_len = 0;           // the optimizer range in the flat buffer
};

// Throws ztrain::Error for a packed parameter that does not follow an owned one of its kind.
FlatLayout LayOut(const std::vector<FlatParam>& params, const FlatLayoutOptions& options);

// The flat size of a layer whose parameter `first` (one `params` names) is placed at offset 0
// and whose other owned trainable parameters follow, as LayOut places them, before padding
// for dp: what two pipeline stages sharing that weight must both hold at least.
int64_t TiedLayoutSize(const std::vector<FlatParam>& params, const std::string& first);

}  // namespace ztrain::zero
