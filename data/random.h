#pragma once
// Fixed-algorithm pseudo-random numbers for data/ (Note [Data randomness]).
//
// Note [Data randomness]: every random choice in data/ (the synthetic corpus, the shuffle
// order) goes through these functions, never through <random> distributions or
// std::shuffle, whose algorithms the C++ standard leaves to the implementation. So the same
// seed gives the same corpus and the same sample order with any compiler and standard
// library. SplitMix64 (Steele, Lea, Flood 2014) derives seeds and hashes; xoshiro256**
// (Blackman, Vigna 2018) generates streams. Pure value types; not thread safe per object.
#include <cstdint>

namespace ztrain::data {

// SplitMix64's finaliser: a bijective 64-bit mix, used as a keyed hash.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Combines a seed with a stream/epoch number into an independent seed.
inline uint64_t DeriveSeed(uint64_t seed, uint64_t stream) {
  return Mix64(Mix64(seed) ^ (stream * 0xd6e8feb86659fd93ull + 0x2545f4914f6cdd1dull));
}

// xoshiro256**, seeded by four SplitMix64 outputs.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    for (uint64_t& s : s_) {
      s = Mix64(seed);
      seed += 0x9e3779b97f4a7c15ull;
    }
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double NextDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  // Uniform in [0, n) for n >= 1, by rejection of the low remainder (no modulo bias).
  uint64_t Below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      const uint64_t x = Next();
      if (x >= threshold) return x % n;
    }
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace ztrain::data
