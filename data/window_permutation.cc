#include "data/window_permutation.h"

#include <bit>

#include "core/error.h"
#include "data/random.h"

namespace ztrain::data {
namespace {
constexpr int kRounds = 6;
}  // namespace

WindowPermutation::WindowPermutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
  ZTRAIN_ASSERT(n >= 1, "a permutation of an empty set");
  const int bits = std::bit_width(n - 1);  // bits needed for the largest index
  half_bits_ = bits <= 2 ? 1 : (bits + 1) / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
}

uint64_t WindowPermutation::Encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t f = Mix64(key_ ^ Mix64((static_cast<uint64_t>(r) << 32) ^ right)) & half_mask_;
    const uint64_t next_right = left ^ f;
    left = right;
    right = next_right;
  }
  return (left << half_bits_) | right;
}

uint64_t WindowPermutation::operator()(uint64_t i) const {
  ZTRAIN_ASSERT(i < n_, "index ", i, " outside a permutation of ", n_);
  uint64_t x = Encrypt(i);
  while (x >= n_) x = Encrypt(x);  // cycle walking: stays inside i's cycle, so ends in [0, n)
  return x;
}

}  // namespace ztrain::data
