#pragma once
// The shape of one causal self-attention call on the GPU, shared by the fp32 kernels
// (attention.cu) and the tensor-core ones for 16-bit dtypes (attention_tc.cu): NH query
// heads, NKV key/value heads of HS features; a qkv row holds q (NH heads), k and v (NKV heads
// each); an out / dout row holds NH heads. Query head h reads KV head h / (NH / NKV).
#include <cstdint>

namespace ztrain::kernels::cuda {

struct AttentionShape {
  int64_t batch, seq;
  int heads, kv_heads, head_size;
  // Tiles of `rows` positions covering the sequence.
  __host__ __device__ int64_t TilesOf(int64_t rows) const { return (seq + rows - 1) / rows; }
  __host__ __device__ int group() const { return heads / kv_heads; }  // query heads per KV head
  __host__ __device__ int64_t out_width() const { return int64_t{heads} * head_size; }
  __host__ __device__ int64_t kv_width() const { return int64_t{kv_heads} * head_size; }
  __host__ __device__ int64_t qkv_width() const { return out_width() + 2 * kv_width(); }
  // Columns of query head h, and of key / value head g, within a qkv row.
  __host__ __device__ int64_t QCol(int64_t h) const { return h * head_size; }
  __host__ __device__ int64_t KCol(int64_t g) const { return out_width() + g * head_size; }
  __host__ __device__ int64_t VCol(int64_t g) const { return KCol(g) + kv_width(); }
};

#ifdef __CUDACC__
// This block's (batch, head, tile) with tiles of `rows` positions over `heads` heads (query
// heads or KV heads); bh = b * heads + h. With last_first, tiles are handed out last first,
// as they do the most work under the causal mask.
struct AttentionTile {
  int64_t b, h, bh, tile;
  __device__ AttentionTile(const AttentionShape& s, int heads, int64_t rows, bool last_first) {
    const int64_t tiles = s.TilesOf(rows);
    bh = blockIdx.x / tiles;
    tile = last_first ? tiles - 1 - blockIdx.x % tiles : blockIdx.x % tiles;
    b = bh / heads;
    h = bh % heads;
  }
};
#endif

}  // namespace ztrain::kernels::cuda
