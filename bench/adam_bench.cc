// adam_bench: the AdamW step's memory bandwidth against STREAM measured in the same run.
//
//   adam_bench [params] [reps]     (default: GPT-2 124M = 124475904 parameters, 10 reps)
//
// The Adam step is memory-bound: per element it reads p, g, m, v and writes p, m, v
// (28 bytes of fp32). STREAM copy and triad run on arrays of the same total size as that
// state (4 x params floats), so every figure is far out of cache. Each is the best of `reps`
// after a warm-up (bench/bench_util.h); run on an idle machine for stable numbers.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "optim/adam.h"

namespace {

using ztrain::bench::BestOf;
using ztrain::bench::FloatArray;
using ztrain::bench::GBs;
namespace optim = ztrain::optim;

constexpr int64_t kGpt2SmallParams = 124475904;
constexpr double kAdamBytesPerParam = 28.0;  // 4 reads + 3 writes of fp32

struct AdamState {
  FloatArray p, g, m, v;
  explicit AdamState(size_t n) : p(n), g(n), m(n), v(n) {
    const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      const uint32_t h = static_cast<uint32_t>(i) * 2654435761u;  // cheap, varied, nonzero
      p[i] = 0.02f * (static_cast<float>(h >> 8) * 0x1p-24f - 0.5f);
      g[i] = 1e-3f * (static_cast<float>((h >> 4) & 0xffff) * 0x1p-16f - 0.49f);
    }
  }
};

double AdamGBs(AdamState& s, optim::AdamImpl impl, int reps) {
  optim::AdamStepArgs args;
  args.weight_decay = 0.1f;
  const int64_t n = static_cast<int64_t>(s.p.size());
  const double seconds = BestOf(reps, [&] {
    optim::AdamStep(args, s.p.data(), s.g.data(), s.m.data(), s.v.data(), n, impl);
    ++args.step;
  });
  return GBs(kAdamBytesPerParam * static_cast<double>(n), seconds);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t params = argc > 1 ? std::atoll(argv[1]) : kGpt2SmallParams;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  if (params <= 0 || reps <= 0) {
    std::fprintf(stderr, "usage: adam_bench [params > 0] [reps > 0]\n");
    return 2;
  }
  const double state_gb = 16.0 * static_cast<double>(params) * 1e-9;
  std::printf(
      "adam_bench: %lld params, Adam state p,g,m,v fp32 = %.2f GB, %d OpenMP threads, "
      "best of %d after 1 warm-up\n",
      static_cast<long long>(params), state_gb, omp_get_max_threads(), reps);

  // STREAM arrays hold as many bytes in total as the Adam state. Triad runs before and after
  // the Adam runs; the better of the two is the reference (the machine may be shared).
  const size_t total_floats = 4 * static_cast<size_t>(params);
  const double copy = ztrain::bench::StreamCopyGBs(total_floats / 2, reps);
  const double triad_before = ztrain::bench::StreamTriadGBs(total_floats / 3, reps);

  std::vector<std::pair<std::string, double>> adam;  // name, GB/s; < 0: not supported
  {
    AdamState state(static_cast<size_t>(params));
    for (optim::AdamImpl impl :
         {optim::AdamImpl::kScalar, optim::AdamImpl::kAvx2, optim::AdamImpl::kAvx512}) {
      const bool ok = optim::AdamImplAvailable(impl);
      adam.emplace_back(std::string("adam ") + optim::AdamImplName(impl),
                        ok ? AdamGBs(state, impl, reps) : -1.0);
    }
  }
  const double triad_after = ztrain::bench::StreamTriadGBs(total_floats / 3, reps);
  const double triad = std::max(triad_before, triad_after);

  auto row = [&](const std::string& name, double gbs, const char* note) {
    std::printf("  %-22s %7.1f GB/s  %5.1f%% of triad  %s\n", name.c_str(), gbs,
                100.0 * gbs / triad, note);
  };
  row("stream copy", copy, "(2 arrays, 8 B/elem)");
  row("stream triad (before)", triad_before, "(3 arrays, 12 B/elem)");
  row("stream triad (after)", triad_after, "(3 arrays, 12 B/elem)");
  // Triad's store also reads its line first (write-allocate), moving 16 B per 12 counted;
  // Adam's stores go to lines it has just read, so its 28 B/elem is all the traffic there is.
  row("triad + write-allocate", triad * 16.0 / 12.0, "(16 B/elem actually moved)");
  for (const auto& [name, gbs] : adam) {
    if (gbs < 0) {
      std::printf("  %-22s not supported by this CPU\n", name.c_str());
      continue;
    }
    char note[64];
    std::snprintf(note, sizeof(note), "(28 B/elem, %.1f ms/step)",
                  kAdamBytesPerParam * static_cast<double>(params) / gbs * 1e-6);
    row(name, gbs, note);
  }
  std::printf("  auto picks: %s\n", optim::AdamImplName(optim::BestAdamImpl()));
  return 0;
}
