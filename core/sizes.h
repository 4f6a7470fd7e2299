#pragma once
// Note [Size limits]
// Every count of elements, tokens or bytes in ztrain is an int64_t. A config is refused (by
// name, core/config_ranges.cc CheckSizes) unless the sizes it implies -- the parameters, one
// micro-batch's tokens and activations, the tokens of a step -- are each at most kMaxElements
// (2^50, about 1.1e15: thousands of times any model trained today). Then every byte count (at
// most 16 bytes an element: fp32 value, gradient, Adam m and v), every per-node multiple of
// it and every sum of a few of them fits in 64 bits, so nothing downstream (engine, loader,
// estimate, tune) can overflow, and a config that would is a named error, never a signal or
// a negative count.
#include <cstdint>
#include <initializer_list>
#include <optional>

namespace ztrain {

inline constexpr int64_t kMaxElements = int64_t{1} << 50;

// The product of `factors` (each >= 0) when it is at most kMaxElements; nullopt otherwise.
inline std::optional<int64_t> SizeProduct(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors) {
    if (f < 0 || __builtin_mul_overflow(p, f, &p) || p > kMaxElements) return std::nullopt;
  }
  return p;
}

// a + b when it is at most kMaxElements (a, b >= 0); nullopt otherwise.
inline std::optional<int64_t> SizeSum(std::optional<int64_t> a, std::optional<int64_t> b) {
  if (!a || !b || *a > kMaxElements - *b) return std::nullopt;
  return *a + *b;
}

}  // namespace ztrain
