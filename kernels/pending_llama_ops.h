#pragma once
// TEMPORARY (branch llama-ops only; must not reach main): the multi-head check the attention
// ops use until they take grouped heads, and stub bodies of the Llama ops. The helpers that
// implement the ops delete this file.
#include "core/error.h"
#include "kernels/ops.h"

namespace ztrain::kernels {

inline int MultiHeadOnly(const Tensor& qkv, const AttentionHeads& h, const char* op) {
  ZTRAIN_CHECK(h.num_heads > 0 && h.num_kv_heads == h.num_heads && qkv.dim() == 3 &&
                   h.qkv_width() == qkv.size(2),
               op, ": only multi-head attention with head_dim = C / num_heads so far");
  return h.num_heads;
}

}  // namespace ztrain::kernels
