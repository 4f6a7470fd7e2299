#pragma once
// Helpers for the kernel tests: random data, tensor views over std::vectors, tolerance
// comparisons and central finite differences in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace ztrain::kernels::testing {

inline std::vector<float> Random(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline std::vector<int32_t> RandomInts(size_t n, uint32_t seed, int32_t lo, int32_t hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(gen);
  return v;
}

// A view of v with `shape` (v must hold exactly numel(shape) elements).
template <typename T>
Tensor View(std::vector<T>& v, Shape shape) {
  EXPECT_EQ(static_cast<int64_t>(v.size()), NumElements(shape));
  return Tensor(v.data(), std::is_same_v<T, int32_t> ? DType::kI32 : DType::kF32,
                std::move(shape));
}

inline std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline double Dot(const std::vector<double>& a, const std::vector<float>& w) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * w[i];
  return s;
}

// Expects |got_i - want_i| <= tol * (|want_i| + rms(want)) for every i, so a relative
// tolerance that does not blow up at elements near zero. Reports the worst element.
inline void ExpectClose(const std::vector<float>& got, const std::vector<double>& want,
                        double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double sq = 0.0;
  for (double w : want) sq += w * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(sq / want.size());
  size_t worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = tol * (std::abs(want[i]) + rms) + 1e-30;
    const double ratio = std::abs(got[i] - want[i]) / bound;
    if (!(ratio <= worst_ratio)) {  // also catches NaN
      worst_ratio = ratio;
      worst = i;
    }
  }
  EXPECT_LE(worst_ratio, 1.0) << what << ": element " << worst << " is " << got[worst]
                              << ", expected " << want[worst] << " (tolerance " << tol
                              << " relative, rms " << rms << ")";
}

// Up to `count` distinct indices of [0, n) (all of them when n <= count), sorted.
inline std::vector<size_t> SampleIndices(size_t n, size_t count, uint32_t seed) {
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t{0});
  if (n <= count) return idx;
  std::mt19937 gen(seed);
  std::shuffle(idx.begin(), idx.end(), gen);
  idx.resize(count);
  std::sort(idx.begin(), idx.end());
  return idx;
}

using Objective = std::function<double(const std::vector<double>&)>;

// Central differences of f with respect to x at `indices`, in double.
inline std::vector<double> FiniteDiff(const Objective& f, std::vector<double> x,
                                      const std::vector<size_t>& indices, double h = 1e-4) {
  std::vector<double> grad;
  grad.reserve(indices.size());
  for (size_t i : indices) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double up = f(x);
    x[i] = x0 - h;
    const double down = f(x);
    x[i] = x0;
    grad.push_back((up - down) / (2 * h));
  }
  return grad;
}

// got (a full fp32 gradient) against finite differences of f at a sample of its elements.
inline void ExpectGradMatchesFiniteDiff(const std::vector<float>& got, const Objective& f,
                                        const std::vector<float>& x, size_t samples,
                                        double tol, const std::string& what) {
  const std::vector<size_t> idx = SampleIndices(x.size(), samples, 1234);
  const std::vector<double> fd = FiniteDiff(f, ToDouble(x), idx);
  std::vector<float> picked;
  for (size_t i : idx) picked.push_back(got[i]);
  ExpectClose(picked, fd, tol, what);
}

// Expects `fn` to throw ztrain::Error whose message contains every one of `parts`.
template <typename Fn>
void ExpectErrorMentions(Fn fn, std::initializer_list<const char*> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected ztrain::Error";
  } catch (const Error& e) {
    for (const char* p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message \"" << e.what() << "\" does not mention \"" << p << "\"";
    }
  }
}

}  // namespace ztrain::kernels::testing
