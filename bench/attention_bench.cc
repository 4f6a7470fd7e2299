// Causal attention forward + backward at growing sequence lengths, on the CPU, in fp32 or bf16
// (--dtype; bf16 tensors, fp32 accumulation): the
// measuring stick of issue 36's "flash attention at long T". For each T from --min-seq to
// --max-seq (doubling) it times ztrain's tiled attention ops (Note [Attention tiles],
// kernels/cpu/attention_tile.h) and, in the same run, PyTorch's eager attention of the same
// shape (bench/pytorch_attention.py: the explicit T x T softmax, grouped-query heads repeated,
// up to --torch-max-seq, whose T x T buffers grow as T squared), and the op set's fp32 GEMM at
// 2048^3 as the machine's peak. FLOPs follow FlashAttention-2's convention: the forward is
// 4 T^2 d per head, half of it under the causal mask; the backward 2.5 times the forward.
// With --window W the attention slides (Note [Attention masks]): each query sees its last W
// positions, the FLOPs count the visible pairs (sum over i of min(i + 1, W)) and PyTorch is not
// run.
//   attention_bench [--min-seq N] [--max-seq N] [--batch B] [--heads H] [--kv-heads K]
//                   [--head-size D] [--dtype fp32|bf16] [--window W] [--reps N]
//                   [--torch-max-seq N] [--python PATH] [--no-torch]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/onednn_peak.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace ztrain::bench {
namespace {

struct Options {
  int64_t min_seq = 512, max_seq = 8192, batch = 1, heads = 8, kv_heads = 2, head_size = 64;
  int64_t window = 0;
  int reps = 3;
  int64_t torch_max_seq = 4096;
  std::string python = "/usr/bin/python3";
  DType dtype = DType::kF32;
};

[[noreturn]] void Usage(const char* problem) {
  if (problem) std::fprintf(stderr, "attention_bench: %s\n", problem);
  std::fprintf(stderr,
               "usage: attention_bench [--min-seq N] [--max-seq N] [--batch B] [--heads H] "
               "[--kv-heads K] [--head-size D] [--dtype fp32|bf16] [--window W] [--reps N] "
               "[--torch-max-seq N] "
               "[--python PATH] [--no-torch]\n");
  std::exit(problem ? 2 : 0);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") Usage(nullptr);
    if (arg == "--no-torch") {
      o.python.clear();
      continue;
    }
    if (i + 1 >= argc) Usage(("missing value after " + arg).c_str());
    const std::string value = argv[++i];
    if (arg == "--python") {
      o.python = value;
      continue;
    }
    if (arg == "--dtype") {
      if (value != "fp32" && value != "bf16")
        Usage(("--dtype is fp32 or bf16, not " + value).c_str());
      o.dtype = value == "bf16" ? DType::kBF16 : DType::kF32;
      continue;
    }
    char* end = nullptr;
    const long long n = std::strtoll(value.c_str(), &end, 10);
    if (end == value.c_str() || *end != '\0' || n <= 0) {
      Usage((arg + " takes a positive whole number, not '" + value + "'").c_str());
    }
    if (arg == "--min-seq")
      o.min_seq = n;
    else if (arg == "--max-seq")
      o.max_seq = n;
    else if (arg == "--batch")
      o.batch = n;
    else if (arg == "--heads")
      o.heads = n;
    else if (arg == "--kv-heads")
      o.kv_heads = n;
    else if (arg == "--head-size")
      o.head_size = n;
    else if (arg == "--window")
      o.window = n;
    else if (arg == "--reps")
      o.reps = static_cast<int>(n);
    else if (arg == "--torch-max-seq")
      o.torch_max_seq = n;
    else
      Usage(("unknown option " + arg).c_str());
  }
  if (o.heads % o.kv_heads != 0) Usage("--kv-heads must divide --heads");
  if (o.min_seq > o.max_seq) Usage("--min-seq is above --max-seq");
  return o;
}

// n standard normal values of `dtype` (fp32 or bf16), as bytes.
std::vector<char> Random(int64_t n, uint32_t seed, DType dtype) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<char> v(static_cast<size_t>(n) * DTypeSize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float x = d(rng);
    if (dtype == DType::kBF16) {
      reinterpret_cast<uint16_t*>(v.data())[i] = FloatToBf16(x);
    } else {
      reinterpret_cast<float*>(v.data())[i] = x;
    }
  }
  return v;
}

// The median over `reps` runs after one warm-up, in seconds.
template <typename Fn>
double MedianOf(int reps, Fn&& fn) {
  fn();
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    Timer t;
    fn();
    times.push_back(t.Seconds());
  }
  return Median(times);
}

// The op set's fp32 GEMM at n^3, best of 3: the run's peak.
double GemmPeakGflops(kernels::Ops& ops, int64_t n) {
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a), c(a);
  const Tensor ta(a.data(), DType::kF32, {n, n}), tb(b.data(), DType::kF32, {n, n}),
      tc(c.data(), DType::kF32, {n, n});
  const double best = BestOf(3, [&] { ops.Gemm(false, false, 1.0f, ta, tb, 0.0f, tc); });
  return 2.0 * static_cast<double>(n * n * n) / best / 1e9;
}

struct Torch {
  double fwd_ms = -1.0, bwd_ms = -1.0;
};

Torch RunTorch(const Options& o, int64_t seq) {
  if (o.python.empty() || seq > o.torch_max_seq || o.window > 0) return {};
  const std::string command = "'" + o.python + "' " + ZTRAIN_BENCH_DIR +
                              "/pytorch_attention.py --seq " + std::to_string(seq) + " --batch " +
                              std::to_string(o.batch) + " --heads " + std::to_string(o.heads) +
                              " --kv-heads " + std::to_string(o.kv_heads) + " --head-size " +
                              std::to_string(o.head_size) + " --reps " + std::to_string(o.reps) +
                              " --dtype " + std::string(DTypeName(o.dtype));
  int status = 0;
  const std::string out = CommandOutput(command, &status);
  const size_t brace = out.find('{');
  if (status != 0 || brace == std::string::npos) {
    std::fprintf(stderr, "attention_bench: PyTorch at T = %lld failed: %s\n",
                 static_cast<long long>(seq), out.substr(0, 300).c_str());
    return {};
  }
  const nlohmann::json j = nlohmann::json::parse(out.substr(brace));
  return {j.at("fwd_ms").get<double>(), j.at("bwd_ms").get<double>()};
}

int Run(const Options& o) {
  const std::unique_ptr<kernels::Ops> ops = kernels::MakeCpuOps();
  const kernels::AttentionHeads heads{static_cast<int>(o.heads), static_cast<int>(o.kv_heads),
                                      static_cast<int>(o.head_size)};
  // The peak: the op set's fp32 GEMM for fp32, oneDNN's own bf16 matmul for bf16 (the reference
  // every bf16 bench uses). It is measured again beside each row and the highest so far is
  // used: on a shared machine one measurement can land in a slow moment and flatter a ratio.
  OneDnnPeak bf16_peak(2048);
  const bool bf16 = o.dtype == DType::kBF16;
  if (bf16 && !bf16_peak.available()) {
    std::fprintf(stderr, "attention_bench: --dtype bf16 needs oneDNN in the build for its peak\n");
    return 2;
  }
  auto measure_peak = [&] { return bf16 ? bf16_peak.Measure(3) : GemmPeakGflops(*ops, 2048); };
  double peak = measure_peak();
  const bool torch = !o.python.empty() && PythonHasTorch(o.python);
  std::printf(
      "causal attention%s, %s, B=%lld, %lld query heads over %lld KV heads of %lld; peak: %s at "
      "2048^3 in GFLOP/s, the highest measured so far; median of %d runs\n",
      o.window > 0 ? (" in a window of " + std::to_string(o.window)).c_str() : "",
      std::string(DTypeName(o.dtype)).c_str(), static_cast<long long>(o.batch),
      static_cast<long long>(o.heads), static_cast<long long>(o.kv_heads),
      static_cast<long long>(o.head_size),
      bf16 ? ("oneDNN's bf16 matmul (" + bf16_peak.impl_name() + ")").c_str()
           : "the op set's fp32 GEMM",
      o.reps);
  std::printf("%7s %7s %10s %10s %8s %8s %12s %12s %9s\n", "T", "peak", "fwd ms", "bwd ms",
              "fwd %pk", "bwd %pk", "torch fwd", "torch bwd", "speed-up");
  for (int64_t t = o.min_seq; t <= o.max_seq; t *= 2) {
    if (t > o.min_seq) peak = std::max(peak, measure_peak());
    const int64_t qkv_n = o.batch * t * heads.qkv_width(), out_n = o.batch * t * heads.q_width();
    const DType dt = o.dtype;
    std::vector<char> qkv = Random(qkv_n, 1, dt), dout = Random(out_n, 2, dt), out(dout.size()),
                      dqkv(qkv.size());
    std::vector<float> lse(static_cast<size_t>(o.batch * o.heads * t));
    const Tensor tq(qkv.data(), dt, {o.batch, t, heads.qkv_width()});
    const Tensor to(out.data(), dt, {o.batch, t, heads.q_width()});
    const Tensor td(dout.data(), dt, {o.batch, t, heads.q_width()});
    const Tensor tdq(dqkv.data(), dt, {o.batch, t, heads.qkv_width()});
    const Tensor tl(lse.data(), DType::kF32, {o.batch, o.heads, t});
    const kernels::AttentionMask mask{o.window, {}};
    const double fwd = MedianOf(o.reps, [&] { ops->AttentionForward(tq, heads, mask, to, tl); });
    const double bwd =
        MedianOf(o.reps, [&] { ops->AttentionBackward(td, tq, to, tl, heads, mask, tdq); });
    // FlashAttention-2's count: 4 d per visible (query, key) pair and head forward, T^2 / 2
    // pairs under the causal mask.
    double pairs = 0.5 * static_cast<double>(t) * static_cast<double>(t);
    if (o.window > 0 && o.window < t) {
      const auto w = static_cast<double>(o.window);
      pairs = w * (w + 1) / 2 + static_cast<double>(t - o.window) * w;
    }
    const double fwd_flop = 4.0 * static_cast<double>(o.batch * o.heads * o.head_size) * pairs;
    const double bwd_flop = 2.5 * fwd_flop;
    const Torch ref = torch ? RunTorch(o, t) : Torch{};
    char torch_fwd[32] = "-", torch_bwd[32] = "-", speedup[32] = "-";
    if (ref.fwd_ms > 0) {
      std::snprintf(torch_fwd, sizeof torch_fwd, "%.1f", ref.fwd_ms);
      std::snprintf(torch_bwd, sizeof torch_bwd, "%.1f", ref.bwd_ms);
      std::snprintf(speedup, sizeof speedup, "%.2fx",
                    (ref.fwd_ms + ref.bwd_ms) / ((fwd + bwd) * 1e3));
    }
    std::printf("%7lld %7.1f %10.1f %10.1f %7.1f%% %7.1f%% %12s %12s %9s\n",
                static_cast<long long>(t), peak, fwd * 1e3, bwd * 1e3,
                100.0 * fwd_flop / fwd / 1e9 / peak, 100.0 * bwd_flop / bwd / 1e9 / peak, torch_fwd,
                torch_bwd, speedup);
    std::fflush(stdout);
  }
  if (o.python.empty()) {
    std::printf("(PyTorch not run: --no-torch)\n");
  } else if (!torch) {
    std::printf("(PyTorch not run: %s has no torch)\n", o.python.c_str());
  }
  std::printf(
      "%%pk: attention's FLOPs (FlashAttention-2's count) per second over the peak; "
      "torch: eager attention (explicit T x T softmax), to --torch-max-seq %lld; speed-up: "
      "PyTorch's fwd + bwd over ztrain's\n",
      static_cast<long long>(o.torch_max_seq));
  return 0;
}

}  // namespace
}  // namespace ztrain::bench

int main(int argc, char** argv) { return ztrain::bench::Run(ztrain::bench::Parse(argc, argv)); }
