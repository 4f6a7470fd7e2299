#include "kernels/cpu/attention_tile.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kernels/cpu/check.h"
#include "kernels/cpu/vec_math.h"

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

void CheckAttentionMask(const AttentionMask& mask, const AttentionDims& d, const char* op) {
  ZTRAIN_CHECK(mask.window >= 0, op, ": the sliding window is ", mask.window,
               " keys; it must be positive, or 0 for none");
  if (!mask.positions.defined()) return;
  CheckCpu(mask.positions, {d.batch, d.seq}, op, "positions", DType::kI32);
  const int32_t* pos = mask.positions.data<int32_t>();
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t t = 0; t < d.seq; ++t) {
      // The first row may be inside a document that began before it (ring attention's pieces).
      const int32_t p = pos[b * d.seq + t], prev = t > 0 ? pos[b * d.seq + t - 1] : p - 1;
      ZTRAIN_CHECK(p >= 0 && (p == 0 || p == prev + 1), op, ": positions[", b, "][", t, "] = ", p,
                   t > 0 ? " after " + std::to_string(prev) : std::string(" at the start"),
                   ": a packed sequence's positions count up by one from 0 within each document "
                   "(Hugging Face's position_ids of DataCollatorWithFlattening)");
    }
  }
}

// Note [Attention blocks]: wider key blocks spend less per key on the online softmax's
// bookkeeping (the row max, the rescale of the running output); the keys are packed once per
// call whatever the width. Measured with bench/attention_bench at T = 2048 ... 16384: key
// blocks of 128, 256 and 512 by query blocks of 32, 64 and 128 all land within the run-to-run
// noise of each other, key blocks of 64 lose about a tenth; 64 x 256 keeps a tile's scores
// (64 KiB) in L2 beside its keys. Short sequences use one block, rounded up to the vector.
AttentionBlocks ForwardBlocks(int64_t seq) {
  const int kv = static_cast<int>(std::min<int64_t>(256, RoundUpToVec(std::max<int64_t>(seq, 1))));
  return {64, kv};
}

void PackTransposed(const float* src, int64_t stride, int n, int64_t hs, int cols, float* dst) {
  for (int64_t d = 0; d < hs; ++d) {
    float* row = dst + d * cols;
    for (int j = 0; j < n; ++j) row[j] = src[j * stride + d];
    std::fill(row + n, row + cols, 0.0f);
  }
}

namespace {

// Note [Attention microkernels]: the products are register-blocked with GCC/Clang vector
// types (16 floats: one AVX-512 register, two AVX2 ones): R rows by V vectors of
// accumulators, with V vectors of the shared operand loaded once per step and reused R times
// (R = 6, V = 4 keeps 24 accumulators and 4 operands in AVX-512's 32 registers). Written with
// plain arrays GCC keeps the accumulators on the stack and the loops turn load/store bound.
// Vectors are read and written in place through the unaligned, may_alias type Vec16U and never
// passed by value, so the ABI does not depend on -march.
typedef float Vec16 __attribute__((vector_size(64)));
typedef float Vec16U __attribute__((vector_size(64), aligned(4), may_alias));
constexpr int kRows = 6;

inline Vec16 Load(const float* p) { return *reinterpret_cast<const Vec16U*>(p); }
inline void Store(float* p, const Vec16& v) { *reinterpret_cast<Vec16U*>(p) = v; }

typedef int32_t Vec16i __attribute__((vector_size(64)));
constexpr Vec16i kLane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

// FastExp on 16 lanes (vec_math.h).
inline Vec16 Exp(const Vec16& x) { return FastExpOf<Vec16, Vec16i>(x); }

// Lanes j0 .. j0 + 15 that lie in [lo, hi).
inline Vec16i Visible(int j0, int lo, int hi) {
  const Vec16i j = kLane + j0;
  return (j >= lo) & (j < hi);
}

template <int R, int V>
void ScoreMicro(const float* a, int64_t a_stride, const float* bt, int64_t ldb, int64_t hs,
                float scale, float* s, int64_t lds) {
  Vec16 acc[R][V] = {};
  for (int64_t d = 0; d < hs; ++d) {
    Vec16 b[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) b[v] = Load(bt + d * ldb + v * kVec);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const float av = a[r * a_stride + d];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] += av * b[v];
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) Store(s + r * lds + v * kVec, acc[r][v] * scale);
  }
}

template <int R, int V>
void WeightedMicro(float* dst, int64_t ldd, const float* alpha, const float* w, int64_t w_row,
                   int64_t w_col, int n, const float* src, int64_t lds) {
  Vec16 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    const float a = alpha ? alpha[r] : 1.0f;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = Load(dst + r * ldd + v * kVec) * a;
  }
  for (int c = 0; c < n; ++c) {
    Vec16 x[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) x[v] = Load(src + c * lds + v * kVec);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const float wv = w[r * w_row + c * w_col];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] += wv * x[v];
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) Store(dst + r * ldd + v * kVec, acc[r][v]);
  }
}

// Calls f.template operator()<R>(r) over rows [0, rows) in groups of kRows, then one group of
// the remainder.
template <typename F>
void ForRowGroups(int rows, F&& f) {
  int r = 0;
  for (; r + kRows <= rows; r += kRows) f.template operator()<kRows>(r);
  switch (rows - r) {
    case 5:
      f.template operator()<5>(r);
      break;
    case 4:
      f.template operator()<4>(r);
      break;
    case 3:
      f.template operator()<3>(r);
      break;
    case 2:
      f.template operator()<2>(r);
      break;
    case 1:
      f.template operator()<1>(r);
      break;
    default:
      break;
  }
}

// Calls f.template operator()<V>(x) over x in [0, width) (a multiple of kVec) in chunks of
// four vectors, then one chunk of the remainder; returns the columns left (width % kVec).
template <typename F>
void ForVecChunks(int64_t width, F&& f) {
  int64_t x = 0;
  for (; x + 4 * kVec <= width; x += 4 * kVec) f.template operator()<4>(x);
  switch ((width - x) / kVec) {
    case 3:
      f.template operator()<3>(x);
      break;
    case 2:
      f.template operator()<2>(x);
      break;
    case 1:
      f.template operator()<1>(x);
      break;
    default:
      break;
  }
}

}  // namespace

float OnlineSoftmaxRow(float* s, int lo, int hi, int cols, float* row_max, float* row_sum) {
  if (lo >= hi) {
    std::fill(s, s + cols, 0.0f);
    return 1.0f;
  }
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  Vec16 vmax = Vec16{} + kNegInf;
  for (int j = lo / kVec * kVec; j < hi; j += kVec) {
    const Vec16 x = Load(s + j);
    const Vec16 in = Visible(j, lo, hi) ? x : Vec16{} + kNegInf;
    vmax = in > vmax ? in : vmax;
  }
  float block_max = kNegInf;
  for (int v = 0; v < kVec; ++v) block_max = std::max(block_max, vmax[v]);
  const float new_max = std::max(*row_max, block_max);
  const float alpha = std::exp(*row_max - new_max);  // 0 on the first block (max = -inf)
  Vec16 vsum{};
  for (int j = 0; j < cols; j += kVec) {
    const Vec16 p = Visible(j, lo, hi) ? Exp(Load(s + j) - new_max) : Vec16{};
    Store(s + j, p);
    vsum += p;
  }
  float block_sum = 0.0f;
  for (int v = 0; v < kVec; ++v) block_sum += vsum[v];
  *row_sum = *row_sum * alpha + block_sum;
  *row_max = new_max;
  return alpha;
}

void ProbabilitiesAndGradRow(float* p, float* ds, int lo, int hi, int cols, float lse, float delta,
                             float scale) {
  for (int j = 0; j < cols; j += kVec) {
    const Vec16 pj = Visible(j, lo, hi) ? Exp(Load(p + j) - lse) : Vec16{};
    Store(p + j, pj);
    Store(ds + j, pj * (Load(ds + j) - delta) * scale);
  }
}

void TileScores(const float* a, int64_t a_stride, int rows, const float* bt, int64_t ldb, int cols,
                int64_t hs, float scale, float* s, int64_t lds) {
  ForVecChunks(cols, [&]<int V>(int64_t x) {
    ForRowGroups(rows, [&]<int R>(int r) {
      ScoreMicro<R, V>(a + r * a_stride, a_stride, bt + x, ldb, hs, scale, s + r * lds + x, lds);
    });
  });
}

void AccumulateWeightedRows(float* dst, int64_t ldd, int rows, const float* alpha, const float* w,
                            int64_t w_row, int64_t w_col, int n, const float* src, int64_t lds,
                            int64_t hs) {
  const int64_t vec_cols = hs / kVec * kVec;
  ForVecChunks(vec_cols, [&]<int V>(int64_t x) {
    ForRowGroups(rows, [&]<int R>(int r) {
      WeightedMicro<R, V>(dst + r * ldd + x, ldd, alpha ? alpha + r : nullptr, w + r * w_row, w_row,
                          w_col, n, src + x, lds);
    });
  });
  if (vec_cols == hs) return;
  for (int r = 0; r < rows; ++r) {  // the last hs % 16 columns, one row at a time
    float* out = dst + r * ldd;
    const float a = alpha ? alpha[r] : 1.0f;
    for (int64_t x = vec_cols; x < hs; ++x) out[x] *= a;
    for (int c = 0; c < n; ++c) {
      const float wv = w[r * w_row + c * w_col];
      const float* in = src + c * lds;
      for (int64_t x = vec_cols; x < hs; ++x) out[x] += wv * in[x];
    }
  }
}

}  // namespace ztrain::kernels::cpu
