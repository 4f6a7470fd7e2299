// Rotary position embedding (rotate-half, Hugging Face's Llama) in place on the query and key
// heads of qkv; the backward turns the gradient back by the same angles.
//
// The q and k heads are the first (NH + NKV) * HS columns of each row (ops.h's layout), all
// turned by the same HS/2 angles of the row's position, so the cos/sin of a position are taken
// once (fp32 cosf/sinf of the fp32 angle t * inv_freq[i]) and serve every batch row and head;
// with per-token positions (packed documents) they are taken per row, of the same fp32 angle.
// 16-bit rows are widened a row at a time, turned by the fp32 code and rounded once; v is
// never read or written.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/check.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_ops.h"

namespace ztrain::kernels {
namespace {

struct RopeDims {
  int64_t batch, seq, width, rotated, head_dim;  // rotated: the q and k columns of a row
  int64_t half() const { return head_dim / 2; }
};

RopeDims CheckRope(const Tensor& qkv, const AttentionHeads& heads, const Tensor& inv_freq,
                   const char* op, const char* what) {
  cpu::CheckCpuFloat(qkv, op, what);
  cpu::CheckQkvShape(qkv, heads, op, what);
  ZTRAIN_CHECK(heads.head_dim % 2 == 0, op, ": head_dim = ", heads.head_dim,
               " must be even (RoPE turns element i with element i + head_dim / 2)");
  const RopeDims d{qkv.size(0), qkv.size(1), qkv.size(2),
                   int64_t{heads.num_heads + heads.num_kv_heads} * heads.head_dim, heads.head_dim};
  cpu::CheckCpu(inv_freq, {d.half()}, op, "inv_freq");
  return d;
}

// The per-token positions (null when undefined): int32 [B,T], non-negative, with no
// first_position beside them.
const int32_t* CheckRopePositions(const Tensor& positions, const RopeDims& d,
                                  int64_t first_position, const char* op) {
  if (!positions.defined()) return nullptr;
  cpu::CheckCpu(positions, {d.batch, d.seq}, op, "positions", DType::kI32);
  ZTRAIN_CHECK(first_position == 0, op, ": first_position = ", first_position,
               " with per-token positions; they give every row's position");
  const int32_t* pos = positions.data<int32_t>();
  for (int64_t i = 0; i < d.batch * d.seq; ++i) {
    ZTRAIN_CHECK(pos[i] >= 0, op, ": positions[", i / d.seq, "][", i % d.seq, "] = ", pos[i],
                 " is negative");
  }
  return pos;
}

// Turns each head of x (rotated / hs heads of hs floats) by the angles with cosines c and
// sines s: x'[i] = x[i] c - x[i + hs/2] s, x'[i + hs/2] = x[i + hs/2] c + x[i] s.
void TurnHeads(float* x, int64_t rotated, int64_t hs, const float* c, const float* s) {
  const int64_t half = hs / 2;
  for (int64_t h0 = 0; h0 < rotated; h0 += hs) {
    float* lo = x + h0;
    float* hi = lo + half;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float a = lo[i], b = hi[i];
      lo[i] = a * c[i] - b * s[i];
      hi[i] = b * c[i] + a * s[i];
    }
  }
}

// Turns the q and k heads of every row by its position's angles, or by their negatives
// (inverse: the transpose of the rotation, for the backward). Parallel over positions: each
// takes its cos/sin once for all batch rows.
void Rope(const Tensor& qkv, const RopeDims& d, const float* inv_freq, bool inverse,
          int64_t first_position, float scale, const int32_t* positions) {
  const int64_t half = d.half();
  const DType type = qkv.dtype();
  const bool wide = type == DType::kF32;
  auto* base = static_cast<char*>(qkv.data());
  const int64_t row_bytes = d.width * static_cast<int64_t>(DTypeSize(type));
  const int64_t per_thread = 2 * half + (wide ? 0 : d.rotated);
  std::vector<float> scratch(per_thread * omp_get_max_threads());
#pragma omp parallel if (d.batch * d.seq * d.rotated >= cpu::kParallelGrain)
  {
    float* c = scratch.data() + per_thread * omp_get_thread_num();
    float* s = c + half;
    float* row = s + half;  // the widened q and k of a 16-bit row
    auto angles = [&](int64_t position) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(position) * inv_freq[i];
        c[i] = std::cos(angle) * scale;
        s[i] = (inverse ? -std::sin(angle) : std::sin(angle)) * scale;
      }
    };
#pragma omp for schedule(static)
    for (int64_t t = 0; t < d.seq; ++t) {
      if (positions == nullptr) angles(first_position + t);
      for (int64_t b = 0; b < d.batch; ++b) {
        if (positions != nullptr) angles(positions[b * d.seq + t]);
        char* bytes = base + (b * d.seq + t) * row_bytes;
        if (wide) {
          TurnHeads(reinterpret_cast<float*>(bytes), d.rotated, d.head_dim, c, s);
          continue;
        }
        cpu::WidenSerial(bytes, type, row, d.rotated);
        TurnHeads(row, d.rotated, d.head_dim, c, s);
        cpu::NarrowSerial(row, bytes, type, d.rotated);
      }
    }
  }
}

}  // namespace

void CpuOps::RopeForward(const Tensor& qkv, const AttentionHeads& heads, const Tensor& inv_freq,
                         int64_t first_position, float scale, const Tensor& positions) {
  const RopeDims d = CheckRope(qkv, heads, inv_freq, "RopeForward", "qkv");
  const int32_t* pos = CheckRopePositions(positions, d, first_position, "RopeForward");
  Rope(qkv, d, inv_freq.data<float>(), /*inverse=*/false, first_position, scale, pos);
}

void CpuOps::RopeBackward(const Tensor& dqkv, const AttentionHeads& heads, const Tensor& inv_freq,
                          float scale, const Tensor& positions) {
  const RopeDims d = CheckRope(dqkv, heads, inv_freq, "RopeBackward", "dqkv");
  const int32_t* pos = CheckRopePositions(positions, d, 0, "RopeBackward");
  Rope(dqkv, d, inv_freq.data<float>(), /*inverse=*/true, 0, scale, pos);
}

}  // namespace ztrain::kernels
