#include "bench/onednn_peak.h"

#include <algorithm>
#include <random>
#include <vector>

#include "bench/bench_util.h"
#include "core/dtype.h"

#if ZTRAIN_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace ztrain::bench {

#if ZTRAIN_WITH_ONEDNN

namespace {

std::vector<uint16_t> RandomBf16(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 0.5f);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = FloatToBf16(d(gen));
  return v;
}

}  // namespace

struct OneDnnPeak::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  dnnl::matmul matmul;
  std::vector<uint16_t> a, b;
  std::vector<float> c;
  dnnl::memory am, bm, cm;
};

OneDnnPeak::OneDnnPeak(int64_t n) : n_(n), impl_(std::make_unique<Impl>()) {
  using dnnl::memory;
  Impl& m = *impl_;
  const memory::desc ab_md({n, n}, memory::data_type::bf16, memory::format_tag::ab);
  const memory::desc c_md({n, n}, memory::data_type::f32, memory::format_tag::ab);
#if DNNL_VERSION_MAJOR >= 3
  const dnnl::matmul::primitive_desc pd(m.eng, ab_md, ab_md, c_md);
#else
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ab_md, ab_md, c_md), m.eng);
#endif
  impl_name_ = pd.impl_info_str();
  m.matmul = dnnl::matmul(pd);
  m.a = RandomBf16(n * n, 1);
  m.b = RandomBf16(n * n, 2);
  m.c.resize(n * n);
  m.am = memory(ab_md, m.eng, m.a.data());
  m.bm = memory(ab_md, m.eng, m.b.data());
  m.cm = memory(c_md, m.eng, m.c.data());
}

double OneDnnPeak::Measure(int reps) {
  Impl& m = *impl_;
  const double s = BestOf(reps, [&] {
    m.matmul.execute(m.stream,
                     {{DNNL_ARG_SRC, m.am}, {DNNL_ARG_WEIGHTS, m.bm}, {DNNL_ARG_DST, m.cm}});
    m.stream.wait();
  });
  const double gflops = 2.0 * n_ * n_ * n_ / s / 1e9;
  best_ = std::max(best_, gflops);
  return gflops;
}

#else  // !ZTRAIN_WITH_ONEDNN

struct OneDnnPeak::Impl {};

OneDnnPeak::OneDnnPeak(int64_t n) : n_(n) {}

double OneDnnPeak::Measure(int) { return 0.0; }

#endif

OneDnnPeak::~OneDnnPeak() = default;

}  // namespace ztrain::bench
