#include "parallel/zero/flat_layout.h"

#include <algorithm>

#include "core/error.h"

namespace ztrain::zero {

FlatLayout LayOut(const std::vector<FlatParam>& params, const FlatLayoutOptions& options) {
  FlatLayout out;
  out.offsets.assign(params.size(), -1);
  ParamPacker packer, frozen_packer;
  size_t last_placed = params.size();
  auto place = [&](size_t i) {
    const FlatParam& p = params[i];
    ZTRAIN_CHECK(
        !p.packed || (i > 0 && last_placed == i - 1 && params[i - 1].trainable == p.trainable),
        "packed parameter '", p.name, "' does not follow an owned parameter of its kind");
    out.offsets[i] = p.trainable
                         ? packer.Place(p.elements, p.packed)
                         : frozen_packer.Place(p.elements, p.packed) * options.frozen_element_bytes;
    last_placed = i;
  };
  if (options.first < params.size()) place(options.first);
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].owned && i != options.first) place(i);
  }
  const int64_t dp = options.dp;
  out.padded = AlignUp(std::max(packer.size(), options.min_padded), kParamAlignment * dp);
  out.shard = out.padded / dp;
  out.frozen_padded =
      AlignUp(frozen_packer.size() * options.frozen_element_bytes, kFrozenAlignment * dp);
  out.frozen_shard = out.frozen_padded / dp;
  out.opt_begin = options.shard_optimizer ? options.rank * out.shard : 0;
  out.opt_len = options.shard_optimizer ? out.shard : out.padded;
  return out;
}

int64_t TiedLayoutSize(const std::vector<FlatParam>& params, const std::string& first) {
  std::vector<FlatParam> trainable;
  size_t at = params.size();
  for (const FlatParam& p : params) {
    if (p.name == first) at = trainable.size();
    if (p.name == first || (p.owned && p.trainable)) trainable.push_back(p);
  }
  ZTRAIN_CHECK(at < trainable.size(), "no parameter '", first, "' to place first");
  trainable[at].owned = true;
  FlatLayoutOptions options;
  options.first = at;
  return LayOut(trainable, options).padded;
}

}  // namespace ztrain::zero
