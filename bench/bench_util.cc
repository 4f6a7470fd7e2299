#include "bench/bench_util.h"

#include <cstdint>
#include <cstdlib>
#include <new>

namespace ztrain::bench {

FloatArray::FloatArray(size_t n) : n_(n) {
  constexpr size_t kPage = 4096;
  const size_t bytes = ((n * sizeof(float) + kPage - 1) / kPage) * kPage;
  float* p = static_cast<float*>(std::aligned_alloc(kPage, bytes > 0 ? bytes : kPage));
  if (p == nullptr) throw std::bad_alloc();
  data_.reset(p);
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) p[i] = 0.0f;
}

void FloatArray::Free::operator()(float* p) const { std::free(p); }

double StreamCopyGBs(size_t n_floats, int reps) {
  FloatArray a(n_floats), b(n_floats);
  const int64_t n = static_cast<int64_t>(n_floats);
  float* __restrict pa = a.data();
  const float* __restrict pb = b.data();
  const double s = BestOf(reps, [&] {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i];
  });
  return GBs(2.0 * sizeof(float) * static_cast<double>(n), s);
}

double StreamTriadGBs(size_t n_floats, int reps) {
  FloatArray a(n_floats), b(n_floats), c(n_floats);
  const int64_t n = static_cast<int64_t>(n_floats);
  float* __restrict pa = a.data();
  const float* __restrict pb = b.data();
  const float* __restrict pc = c.data();
  const float scalar = 3.0f;
  const double s = BestOf(reps, [&] {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + scalar * pc[i];
  });
  return GBs(3.0 * sizeof(float) * static_cast<double>(n), s);
}

}  // namespace ztrain::bench
