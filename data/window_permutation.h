#pragma once
// WindowPermutation: a seeded bijection of [0, n) evaluated in O(1) time and memory.
//
// Used for the shuffled sample order (Note [Shuffle order] in data/data_loader.h): entry i of
// an epoch's order is window Permute(i). The algorithm is fixed (not std::shuffle, whose
// result depends on the standard library): a 6-round balanced Feistel network over the
// smallest domain of 2^(2h) >= n values (h >= 1 bits per half), round function
// Mix64(key ^ Mix64(round << 32 ^ right-half)) masked to h bits, with cycle walking (apply
// the network again while the result is >= n), which keeps it a bijection of [0, n) and
// needs at most 4 passes on average (the domain holds at most 4n values). Immutable; thread safe.
#include <cstdint>

namespace ztrain::data {

class WindowPermutation {
 public:
  // A permutation of [0, n), n >= 1, determined by `key`.
  WindowPermutation(uint64_t n, uint64_t key);
  uint64_t size() const { return n_; }
  // The image of i, for 0 <= i < n.
  uint64_t operator()(uint64_t i) const;

 private:
  uint64_t Encrypt(uint64_t x) const;

  uint64_t n_;
  uint64_t key_;
  int half_bits_;
  uint64_t half_mask_;
};

}  // namespace ztrain::data
