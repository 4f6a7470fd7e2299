#pragma once
// LoRA dropout's mask (Note [LoRA dropout] in nn/modules.h): a pure function of a key and an
// element's place in the WHOLE tensor, so that every layout draws the same mask — a
// data-parallel rank's rows, a tensor-parallel piece's columns, a checkpointed block's
// recomputed forward, the CPU and the CUDA backend. Element (row, col) of the whole tensor is
// kept, and scaled by 1 / (1 - p), when the top 24 bits of SplitMix64's finaliser of
// (key, row, col) are at or above p * 2^24; otherwise it is zeroed. Pure; thread safe.
#include <cstdint>

#if defined(__CUDACC__)
#define ZTRAIN_DROPOUT_HD __host__ __device__
#else
#define ZTRAIN_DROPOUT_HD
#endif

namespace ztrain::kernels {

struct DropoutMask {
  uint64_t key = 0;        // DropoutKey(...) mixed with the adapter's name
  float p = 0.0f;          // the probability of dropping an element, [0, 1)
  int64_t row_offset = 0;  // the tensor's first row in the whole one
  int64_t col_offset = 0;  // its first column in the whole one
  // Rows in runs (context parallelism's pieces of sequences, Note [Context parallelism] in
  // nn/context_parallel.h): with run > 0, each sample's `runs` runs of `run` rows (1, or 2 for
  // ring attention's zigzag chunks) come from a sample of `whole_run` rows, the second run
  // starting `second_run` rows after the first: row r of the tensor is row
  // (r / (run runs)) whole_run + (its run is the second ? second_run : 0) + r % run + row_offset.
  int64_t run = 0;
  int64_t whole_run = 0;
  int64_t runs = 1;
  int64_t second_run = 0;
};

// SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijection of 64-bit words whose every
// output bit depends on every input bit.
ZTRAIN_DROPOUT_HD inline uint64_t MixBits(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The key of one micro-batch of one step: what varies the mask between steps and
// micro-batches and nothing else (not the rank, the layout or the device).
inline uint64_t DropoutKey(uint64_t seed, int64_t step, int64_t micro_batch) {
  return MixBits(MixBits(MixBits(seed ^ 0x6c6f72615f64726full) + static_cast<uint64_t>(step)) +
                 static_cast<uint64_t>(micro_batch));
}

// Whether element (row, col) of the tensor `mask` describes is kept.
ZTRAIN_DROPOUT_HD inline bool DropoutKeeps(const DropoutMask& mask, int64_t row, int64_t col) {
  int64_t whole = row;
  if (mask.run > 0) {
    const int64_t run = row / mask.run;
    whole = run / mask.runs * mask.whole_run + (run % mask.runs == 1 ? mask.second_run : 0) +
            row % mask.run;
  }
  const uint64_t r = static_cast<uint64_t>(mask.row_offset + whole);
  const uint64_t c = static_cast<uint64_t>(mask.col_offset + col);
  const uint64_t h = MixBits(mask.key + MixBits((r << 32) ^ c));
  return (h >> 40) >= static_cast<uint64_t>(mask.p * 16777216.0f);
}

}  // namespace ztrain::kernels
