// adam_bench: the AdamW step against the memory-bandwidth bound and against PyTorch's
// torch.optim.AdamW, all measured in the same run.
//
//   adam_bench [params] [reps] [--python PATH] [--no-torch]
//       (default: 64M = 67108864 parameters, 1 GiB of state; 10 reps; /usr/bin/python3)
//
// The Adam step is memory-bound: per parameter it reads p, g, m, v and writes p, m, v
// (28 bytes of fp32), so the most parameters a second it can update is the memory bandwidth
// over 28 bytes. The bandwidth is a STREAM triad on arrays of the same total size as the
// Adam state (4 x params floats), measured before and after the Adam runs (the better one
// counts: the machine may be shared), so every figure is far out of cache; the target is
// ztrain at >= 0.85x that bound. The PyTorch reference (bench/pytorch_adamw.py, in Debian's
// python3-torch; a pyenv python3 earlier on PATH has no torch, hence the explicit
// interpreter) steps one flat parameter of the same size on the same number of threads,
// twice: as installed, and with glibc told to keep freed memory in its heap. PyTorch's AdamW
// makes temporaries of n floats every step; glibc serves each from a fresh mmap whose pages
// fault in on first touch, which on this VM costs more than the arithmetic; the second run
// (MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_, what a caching allocator would give)
// shows PyTorch's kernels themselves, and the faster PyTorch figure is the one compared.
// Each figure is the best of `reps` after a warm-up (bench/bench_util.h); the as-installed
// PyTorch run, seconds per step, takes the best of at most 3.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
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

constexpr int64_t kDefaultParams = int64_t{1} << 26;
constexpr double kAdamBytesPerParam = 28.0;  // 4 reads + 3 writes of fp32

struct Options {
  int64_t params = kDefaultParams;
  int reps = 10;
  std::string python = "/usr/bin/python3";
  bool torch = true;
};

Options ParseOptions(int argc, char** argv) {
  Options o;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-torch") == 0) {
      o.torch = false;
    } else if (std::strcmp(argv[i], "--python") == 0 && i + 1 < argc) {
      o.python = argv[++i];
    } else if (positional == 0) {
      o.params = std::atoll(argv[i]), ++positional;
    } else {
      o.reps = std::atoi(argv[i]), ++positional;
    }
  }
  return o;
}

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

// Best seconds of one AdamW step over the whole state.
double AdamSeconds(AdamState& s, optim::AdamImpl impl, int reps) {
  optim::AdamStepArgs args;
  args.weight_decay = 0.1f;
  const int64_t n = static_cast<int64_t>(s.p.size());
  return BestOf(reps, [&] {
    optim::AdamStep(args, s.p.data(), s.g.data(), s.m.data(), s.v.data(), n, impl);
    ++args.step;
  });
}

// One PyTorch AdamW implementation timed by bench/pytorch_adamw.py.
struct TorchResult {
  std::string name;  // "single" (the CPU default, foreach=False), "foreach", "fused"
  double seconds;    // best step; NaN where this torch lacks the implementation
};

// Whether `python` can import torch; says why not on stdout.
bool HaveTorch(const Options& o) {
  if (ztrain::bench::PythonHasTorch(o.python)) return true;
  std::printf(
      "  PyTorch: %s cannot import torch; skipping the PyTorch reference "
      "(apt-get install python3-torch, or --python PATH)\n",
      o.python.c_str());
  return false;
}

// Runs bench/pytorch_adamw.py under `env` (variable assignments, may be empty) and parses
// its last line; fills `version`. Empty on failure (said on stdout).
std::vector<TorchResult> RunPytorch(const Options& o, int threads, int reps, const std::string& env,
                                    std::string& version) {
  const std::string cmd = "env " + env + " '" + o.python +
                          "' '" ZTRAIN_BENCH_DIR "/pytorch_adamw.py' --params " +
                          std::to_string(o.params) + " --reps " + std::to_string(reps) +
                          " --threads " + std::to_string(threads);
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return {};
  std::vector<TorchResult> results;
  char line[512];
  while (std::fgets(line, sizeof(line), pipe) != nullptr) {
    if (std::strncmp(line, "pytorch_adamw:", 14) != 0) continue;
    std::istringstream fields(line + 14);
    for (std::string kv; fields >> kv;) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) continue;
      const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
      if (key == "version") version = value;
      if (key == "single" || key == "foreach" || key == "fused") {
        results.push_back({key, std::strtod(value.c_str(), nullptr)});
      }
    }
  }
  if (pclose(pipe) != 0 || results.empty()) {
    std::printf("  PyTorch: %s failed; no PyTorch reference\n", cmd.c_str());
    return {};
  }
  return results;
}

struct TorchRun {
  const char* malloc;  // how PyTorch's temporaries were allocated
  std::vector<TorchResult> results;
};

// Parameters per second against the bound (triad bandwidth / 28 B per parameter) for ztrain's
// kernels and PyTorch's; returns nothing, prints the table.
void PrintParamsPerSecond(double params, double triad,
                          const std::vector<std::pair<std::string, double>>& adam,
                          const std::vector<TorchRun>& torch, const std::string& version,
                          int threads) {
  const double bound = triad * 1e9 / kAdamBytesPerParam;
  const optim::AdamImpl best = optim::BestAdamImpl();
  double ztrain_best = 0.0, torch_best = 0.0;
  std::printf(
      "parameters/s (bound = triad %.1f GB/s / 28 B = %.0f M params/s; counting "
      "triad's write-allocate too, %.0f M):\n",
      triad, bound * 1e-6, bound * 16.0 / 12.0 * 1e-6);
  for (const auto& [name, s] : adam) {
    if (s < 0) continue;
    const double rate = params / s;
    if (name == std::string("adam ") + optim::AdamImplName(best)) ztrain_best = rate;
    std::printf("  ztrain %-30s %7.0f M params/s  %.2fx bound (target >= 0.85x)\n", name.c_str(),
                rate * 1e-6, rate / bound);
  }
  std::printf("  auto picks: %s\n", optim::AdamImplName(best));
  for (const TorchRun& run : torch) {
    for (const TorchResult& r : run.results) {
      const std::string name = "torch " + r.name + " (" + run.malloc + ")";
      if (std::isnan(r.seconds)) {
        if (&run != &torch.front()) continue;  // said once
        std::printf("  %-37s not in PyTorch %s on the CPU\n", name.c_str(), version.c_str());
        continue;
      }
      const double rate = params / r.seconds;
      torch_best = std::max(torch_best, rate);
      std::printf("  %-37s %7.0f M params/s  %.2fx bound  (%.1f ms/step)\n", name.c_str(),
                  rate * 1e-6, rate / bound, r.seconds * 1e3);
    }
  }
  if (torch_best > 0) {
    std::printf("  ztrain %s / best PyTorch %s AdamW (both %d threads): %.2fx\n",
                optim::AdamImplName(best), version.c_str(), threads, ztrain_best / torch_best);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseOptions(argc, argv);
  if (o.params <= 0 || o.reps <= 0) {
    std::fprintf(stderr,
                 "usage: adam_bench [params > 0] [reps > 0] [--python PATH] [--no-torch]\n");
    return 2;
  }
  const int threads = omp_get_max_threads();
  const double params = static_cast<double>(o.params);
  std::printf(
      "adam_bench: %lld params, Adam state p,g,m,v fp32 = %.2f GB, %d OpenMP threads, "
      "best of %d after 1 warm-up\n",
      static_cast<long long>(o.params), 16.0 * params * 1e-9, threads, o.reps);

  // STREAM arrays hold as many bytes in total as the Adam state.
  const size_t total_floats = 4 * static_cast<size_t>(o.params);
  const double copy = ztrain::bench::StreamCopyGBs(total_floats / 2, o.reps);
  const double triad_before = ztrain::bench::StreamTriadGBs(total_floats / 3, o.reps);

  std::vector<std::pair<std::string, double>> adam;  // name, seconds; < 0: not supported
  {
    AdamState state(static_cast<size_t>(o.params));
    for (optim::AdamImpl impl :
         {optim::AdamImpl::kScalar, optim::AdamImpl::kAvx2, optim::AdamImpl::kAvx512}) {
      const bool ok = optim::AdamImplAvailable(impl);
      adam.emplace_back(std::string("adam ") + optim::AdamImplName(impl),
                        ok ? AdamSeconds(state, impl, o.reps) : -1.0);
    }
  }  // the state is freed before PyTorch allocates its own
  std::vector<TorchRun> torch;
  std::string version;
  if (o.torch && HaveTorch(o)) {
    torch.push_back({"as installed", RunPytorch(o, threads, std::min(o.reps, 3), "", version)});
    torch.push_back(
        {"heap kept", RunPytorch(o, threads, o.reps, ztrain::bench::kKeepHeapEnv, version)});
  }
  const double triad_after = ztrain::bench::StreamTriadGBs(total_floats / 3, o.reps);
  const double triad = std::max(triad_before, triad_after);

  std::printf("bandwidth (GB/s as STREAM counts it: bytes the kernel names):\n");
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
  for (const auto& [name, s] : adam) {
    if (s < 0) {
      std::printf("  %-22s not supported by this CPU\n", name.c_str());
      continue;
    }
    char note[64];
    std::snprintf(note, sizeof(note), "(28 B/elem, %.1f ms/step)", s * 1e3);
    row(name, GBs(kAdamBytesPerParam * params, s), note);
  }
  PrintParamsPerSecond(params, triad, adam, torch, version, threads);
  return 0;
}
