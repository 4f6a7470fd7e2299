#include "kernels/ops.h"

#include "core/error.h"

namespace ztrain::kernels {

void Ops::AttentionDecode(const Tensor&, const Tensor&, const Tensor&, const AttentionHeads&,
                          const Tensor&) {
  throw Error(detail::StrCat("AttentionDecode (incremental decoding with a KV cache) is not "
                             "implemented on ", device().ToString(),
                             "; generation runs on the CPU"));
}

}  // namespace ztrain::kernels
