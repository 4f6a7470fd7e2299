#pragma once
// The shapes the CUDA attention tests run (cuda_attention_test.cc, and cuda_ops_test.cc's
// determinism and bad-input cases).
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace ztrain::kernels::testing {

inline std::string HeadsName(int64_t batch, int64_t seq, const AttentionHeads& h) {
  return "B=" + std::to_string(batch) + " T=" + std::to_string(seq) +
         " NH=" + std::to_string(h.num_heads) + " NKV=" + std::to_string(h.num_kv_heads) +
         " HS=" + std::to_string(h.head_dim);
}

struct AttnCase {
  int64_t batch, seq;
  AttentionHeads heads;
  Shape qkv() const { return {batch, seq, heads.qkv_width()}; }
  Shape out() const { return {batch, seq, heads.q_width()}; }
  Shape lse() const { return {batch, heads.num_heads, seq}; }
  std::string Name() const { return HeadsName(batch, seq, heads); }
};

// T never a multiple of the 32- or 64-row tiles. Multi-head with HS 64 (GPT-2), 32, 48 and
// 128; grouped-query with groups of 2, 3 and 4 (Llama 3's 32/8 in small); multi-query; and
// head sizes off the kernels' 32/64/128 tile widths (80, 16, 24), as models whose hidden
// size is not NH * head_dim have.
inline const AttnCase kAttnCases[] = {
    {2, 45, {2, 2, 64}}, {1, 70, {3, 3, 32}}, {1, 37, {2, 2, 48}},   {2, 33, {2, 2, 128}},
    {2, 45, {4, 2, 64}}, {1, 70, {6, 2, 32}}, {1, 100, {8, 2, 128}}, {2, 37, {4, 1, 48}},
    {1, 65, {3, 1, 80}}, {2, 40, {4, 4, 16}}, {1, 50, {6, 3, 24}}};

}  // namespace ztrain::kernels::testing
