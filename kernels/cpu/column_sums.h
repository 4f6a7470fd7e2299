#pragma once
// Note [Deterministic column sums]: a parameter gradient summed over rows (a bias, a norm's
// weight) is cut into blocks of kColumnBlock columns; one task owns a block and adds the rows
// into it in row order. So the sum depends on the shapes only, never on the thread count, and
// no two threads write one element. Used by the linear layer's dbias (gemm.cc,
// gemm_mixed.cc), LayerNorm's dweight/dbias and RMSNorm's dweight.
#include <algorithm>
#include <array>
#include <cstdint>

namespace ztrain::kernels::cpu {

inline constexpr int64_t kColumnBlock = 64;  // columns one task of a column sum owns

// For each block of kColumnBlock columns of a [rows, cols] sum: K accumulators of the block
// start at 0, row_fn(r, c0, width, acc) adds row r's columns [c0, c0 + width) into
// acc[k][0, width) for r = 0, 1, ... in order, then dst[k][c0 + c] += acc[k][c]. The blocks
// are an orphaned `omp for`: shared among the threads when called inside a parallel region
// (with its barrier at the end), run by the caller alone otherwise.
template <int K, typename RowFn>
void SumColumnBlocks(int64_t rows, int64_t cols, const std::array<float*, K>& dst, RowFn&& row_fn) {
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
#pragma omp for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, cols - c0);
    float acc[K][kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r) row_fn(r, c0, width, acc);
    for (int k = 0; k < K; ++k) {
      for (int64_t c = 0; c < width; ++c) dst[k][c0 + c] += acc[k][c];
    }
  }
}

}  // namespace ztrain::kernels::cpu
