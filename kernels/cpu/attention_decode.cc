// Attention of new positions over a KV cache (ops.h AttentionDecode, Note [KV cache] in
// nn/decoder.h): each (new position, query head) is one task: scores against every cached key
// its position sees, an fp32 softmax (max subtracted), and the weighted sum of the values.
// Work per new token grows with the cache length only, not with its square.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace ztrain::kernels {

void CpuOps::AttentionDecode(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                             const AttentionHeads& heads, const Tensor& out) {
  const char* op = "AttentionDecode";
  cpu::CheckHeads(heads, op);
  const int64_t t = qkv.dim() == 2 ? qkv.size(0) : -1;
  const int64_t len = k_cache.dim() == 2 ? k_cache.size(0) : -1;
  cpu::CheckCpu(qkv, {t, heads.qkv_width()}, op, "qkv");
  cpu::CheckCpu(k_cache, {len, heads.kv_width()}, op, "k_cache");
  cpu::CheckCpu(v_cache, {len, heads.kv_width()}, op, "v_cache");
  cpu::CheckCpu(out, {t, heads.q_width()}, op, "out");
  ZTRAIN_CHECK(len >= t, op, ": the cache holds ", len, " positions, fewer than the ", t,
               " new ones it must end with");
  const int hs = heads.head_dim, group = heads.num_heads / heads.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const float* q = qkv.data<float>();
  const float* k = k_cache.data<float>();
  const float* v = v_cache.data<float>();
  float* o = out.data<float>();
  const int64_t tasks = t * heads.num_heads;
  std::vector<float> scores(static_cast<size_t>(len) * omp_get_max_threads());
#pragma omp parallel for schedule(static) if (tasks * len * hs >= cpu::kParallelGrain)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t i = task / heads.num_heads;
    const int h = static_cast<int>(task % heads.num_heads);
    const int64_t seen = len - t + i + 1;  // keys 0 .. position of new row i
    const float* qh = q + i * heads.qkv_width() + int64_t{h} * hs;
    const int64_t kv = int64_t{h / group} * hs;
    float* s = scores.data() + static_cast<size_t>(len) * omp_get_thread_num();
    float max = -INFINITY;
    for (int64_t j = 0; j < seen; ++j) {
      const float* kj = k + j * heads.kv_width() + kv;
      float dot = 0;
      for (int d = 0; d < hs; ++d) dot += qh[d] * kj[d];
      s[j] = dot * scale;
      max = std::max(max, s[j]);
    }
    float sum = 0;
    for (int64_t j = 0; j < seen; ++j) {
      s[j] = std::exp(s[j] - max);
      sum += s[j];
    }
    float* oh = o + i * heads.q_width() + int64_t{h} * hs;
    for (int d = 0; d < hs; ++d) oh[d] = 0;
    for (int64_t j = 0; j < seen; ++j) {
      const float p = s[j] / sum;
      const float* vj = v + j * heads.kv_width() + kv;
      for (int d = 0; d < hs; ++d) oh[d] += p * vj[d];
    }
  }
}

}  // namespace ztrain::kernels
