#include "kernels/ops.h"

#include "core/error.h"

namespace ztrain::kernels {

void Ops::AttentionDecode(const Tensor&, const Tensor&, const Tensor&, const AttentionHeads&,
                          const Tensor&) {
  throw Error(detail::StrCat("AttentionDecode (incremental decoding with a KV cache) is not "
                             "implemented on ", device().ToString(),
                             "; generation runs on the CPU"));
}

void Ops::MergeAttention(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  throw Error(detail::StrCat("MergeAttention (ring attention) is not implemented on ",
                             device().ToString(), "; context parallelism runs on the CPU"));
}

GemmShape CheckGemmShapes(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b,
                          const Tensor& c, const char* op) {
  ZTRAIN_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, op, ": a, b and c must be 2-D, got a ",
               ShapeToString(a.shape()), ", b ", ShapeToString(b.shape()), ", c ",
               ShapeToString(c.shape()));
  const GemmShape s{trans_a, trans_b, trans_a ? a.size(1) : a.size(0),
                    trans_b ? b.size(0) : b.size(1), trans_a ? a.size(0) : a.size(1)};
  const int64_t kb = trans_b ? b.size(1) : b.size(0);
  ZTRAIN_CHECK(kb == s.k, op, ": b has shape ", ShapeToString(b.shape()), " but op(a) ",
               ShapeToString(a.shape()), (trans_a ? " (transposed)" : ""), " has K = ", s.k,
               (trans_b ? "; expected b [N, K]" : "; expected b [K, N]"));
  ZTRAIN_CHECK(c.size(0) == s.m && c.size(1) == s.n, op, ": c has shape ", ShapeToString(c.shape()),
               ", expected ", ShapeToString({s.m, s.n}));
  return s;
}

}  // namespace ztrain::kernels
