#include "kernels/cpu/attention_tile.h"

#include "kernels/cpu/check.h"

namespace ztrain::kernels::cpu {

AttentionDims CheckAttention(const Tensor& qkv, const AttentionHeads& heads, const Tensor& out,
                             const Tensor& lse, const char* op) {
  CheckCpu(qkv, op, "qkv");
  CheckQkvShape(qkv, heads, op, "qkv");
  const AttentionDims d{qkv.size(0), qkv.size(1), heads.num_heads, heads.num_kv_heads,
                        heads.head_dim};
  CheckCpu(out, {d.batch, d.seq, d.q_width()}, op, "out");
  CheckCpu(lse, {d.batch, d.heads, d.seq}, op, "lse");
  return d;
}

}  // namespace ztrain::kernels::cpu
