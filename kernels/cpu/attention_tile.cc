#include "kernels/cpu/attention_tile.h"

#include "kernels/cpu/check.h"

namespace ztrain::kernels::cpu {

AttentionDims CheckAttention(const Tensor& qkv, int num_heads, const Tensor& out,
                             const Tensor& lse, const char* op) {
  CheckCpu(qkv, op, "qkv");
  ZTRAIN_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, op, ": qkv has shape ",
               ShapeToString(qkv.shape()), ", expected [B, T, 3C]");
  AttentionDims d{qkv.size(0), qkv.size(1), qkv.size(2) / 3, num_heads, 0};
  ZTRAIN_CHECK(num_heads > 0 && d.channels % num_heads == 0, op, ": num_heads = ", num_heads,
               " must be positive and divide C = ", d.channels);
  d.head_size = d.channels / num_heads;
  CheckCpu(out, {d.batch, d.seq, d.channels}, op, "out");
  CheckCpu(lse, {d.batch, d.heads, d.seq}, op, "lse");
  return d;
}

}  // namespace ztrain::kernels::cpu
