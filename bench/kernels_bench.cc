// Per-op timings of the CPU op set at the GPT-2 124M step shape (B=4, T=64, C=768, NH=12,
// Vp=50304), and of the Llama ops at a Llama-3.2-1B-like shape (B=2, T=256, C=2048, NH=32,
// NKV=8, HS=64, FF=8192; attention also with NKV=32, multi-head, for comparison), with
// Google Benchmark. GEMM-bound ops report FLOP/s, memory-bound ones bytes/s;
// the same binary measures the references (a 2048^3 SGEMM and a STREAM triad), so
//   build/bench/kernels_bench --benchmark_counters_tabular=true
// shows each op next to the machine's peak from the same run.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <random>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/ops.h"

namespace {

using ztrain::DType;
using ztrain::Tensor;

constexpr int64_t kB = 4, kT = 64, kC = 768, kNH = 12, kV = 50257, kVp = 50304;
constexpr int64_t kN = kB * kT;
// The Llama shape.
constexpr int64_t kLB = 2, kLT = 256, kLC = 2048, kLNH = 32, kLNKV = 8, kLHS = 64, kLFF = 8192;
constexpr int64_t kLN = kLB * kLT;

// Owns fp32 storage and hands out tensor views.
struct Arena {
  std::vector<std::vector<float>> blocks;
  Tensor F32(ztrain::Shape shape, float scale = 0.1f) {
    std::mt19937 rng(static_cast<unsigned>(blocks.size()));
    std::normal_distribution<float> d(0.f, scale);
    blocks.emplace_back(ztrain::NumElements(shape));
    for (float& x : blocks.back()) x = d(rng);
    return Tensor(blocks.back().data(), DType::kF32, std::move(shape));
  }
};

void SetFlops(benchmark::State& s, double flops) {
  s.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}
void SetBytes(benchmark::State& s, double bytes) {
  s.counters["bytes/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_SgemmPeak2048(benchmark::State& s) {
  const int n = 2048;
  std::vector<float> a(size_t(n) * n, 0.5f), b(a), c(a);
  for (auto _ : s) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(),
                n, 0.f, c.data(), n);
  }
  SetFlops(s, 2.0 * n * n * n);
}

void BM_StreamTriad(benchmark::State& s) {
  const size_t n = size_t(1) << 25;  // 128 MiB per array
  ztrain::bench::FloatArray a(n), b(n), c(n);
  for (size_t i = 0; i < n; ++i) b[i] = 1.f, c[i] = 2.f;
  for (auto _ : s) {
    float* pa = a.data();
    const float* pb = b.data();
    const float* pc = c.data();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) pa[i] = pb[i] + 3.f * pc[i];
    benchmark::ClobberMemory();
  }
  SetBytes(s, 12.0 * n);
}

void BM_LinearForwardQkv(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  Tensor x = m.F32({kN, kC}), w = m.F32({3 * kC, kC}), b = m.F32({3 * kC}), y = m.F32({kN, 3 * kC});
  for (auto _ : s) ops->LinearForward(x, w, b, y);
  SetFlops(s, 2.0 * kN * kC * 3 * kC);
}

void BM_LinearBackwardQkv(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  Tensor x = m.F32({kN, kC}), w = m.F32({3 * kC, kC}), dy = m.F32({kN, 3 * kC});
  Tensor dx = m.F32({kN, kC}), dw = m.F32({3 * kC, kC}), db = m.F32({3 * kC});
  for (auto _ : s) ops->LinearBackward(dy, x, w, dx, dw, db);
  SetFlops(s, 4.0 * kN * kC * 3 * kC);
}

void BM_LmHeadForward(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  Tensor x = m.F32({kN, kC}), w = m.F32({kVp, kC}), y = m.F32({kN, kVp});
  for (auto _ : s) ops->LinearForward(x, w, Tensor(), y);
  SetFlops(s, 2.0 * kN * kC * kVp);
}

void BM_AttentionForward(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  Tensor qkv = m.F32({kB, kT, 3 * kC}, 1.f), out = m.F32({kB, kT, kC}), lse = m.F32({kB, kNH, kT});
  for (auto _ : s) ops->AttentionForward(qkv, kNH, out, lse);
  SetFlops(s, 2.0 * 2.0 * kB * kT * kT / 2 * kC);
}

void BM_AttentionBackward(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  Tensor qkv = m.F32({kB, kT, 3 * kC}, 1.f), out = m.F32({kB, kT, kC}), lse = m.F32({kB, kNH, kT});
  Tensor dout = m.F32({kB, kT, kC}), dqkv = m.F32({kB, kT, 3 * kC});
  ops->AttentionForward(qkv, kNH, out, lse);
  for (auto _ : s) ops->AttentionBackward(dout, qkv, out, lse, kNH, dqkv);
  SetFlops(s, 2.0 * 2.0 * 2.0 * kB * kT * kT / 2 * kC);
}

// Causal attention at the Llama shape with state.range(0) KV heads.
ztrain::kernels::AttentionHeads LlamaHeads(const benchmark::State& s) {
  return {static_cast<int>(kLNH), static_cast<int>(s.range(0)), static_cast<int>(kLHS)};
}

void BM_LlamaAttentionForward(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  const auto heads = LlamaHeads(s);
  Tensor qkv = m.F32({kLB, kLT, heads.qkv_width()}, 1.f), out = m.F32({kLB, kLT, heads.q_width()});
  Tensor lse = m.F32({kLB, kLNH, kLT});
  for (auto _ : s) ops->AttentionForward(qkv, heads, out, lse);
  SetFlops(s, 2.0 * 2.0 * kLB * kLT * kLT / 2 * kLNH * kLHS);
}

void BM_LlamaAttentionBackward(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  const auto heads = LlamaHeads(s);
  Tensor qkv = m.F32({kLB, kLT, heads.qkv_width()}, 1.f), out = m.F32({kLB, kLT, heads.q_width()});
  Tensor lse = m.F32({kLB, kLNH, kLT}), dout = m.F32({kLB, kLT, heads.q_width()});
  Tensor dqkv = m.F32({kLB, kLT, heads.qkv_width()});
  ops->AttentionForward(qkv, heads, out, lse);
  for (auto _ : s) ops->AttentionBackward(dout, qkv, out, lse, heads, dqkv);
  SetFlops(s, 2.0 * 2.0 * 2.0 * kLB * kLT * kLT / 2 * kLNH * kLHS);
}

void BM_RmsNormForward(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  Tensor x = m.F32({kLN, kLC}), w = m.F32({kLC}), y = m.F32({kLN, kLC}), rstd = m.F32({kLN});
  for (auto _ : s) ops->RmsNormForward(x, w, 1e-5f, y, rstd);
  SetBytes(s, 8.0 * kLN * kLC);
}

void BM_RmsNormBackward(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  Tensor x = m.F32({kLN, kLC}), w = m.F32({kLC}), y = m.F32({kLN, kLC}), rstd = m.F32({kLN});
  Tensor dy = m.F32({kLN, kLC}), dx = m.F32({kLN, kLC}), dw = m.F32({kLC});
  ops->RmsNormForward(x, w, 1e-5f, y, rstd);
  for (auto _ : s) ops->RmsNormBackward(dy, x, w, rstd, dx, dw);
  SetBytes(s, 12.0 * kLN * kLC);  // dy and x read (twice, from cache), dx written
}

// Bytes: the q and k columns read and written in place (v is not touched).
void BM_RopeForward(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  const ztrain::kernels::AttentionHeads heads{kLNH, kLNKV, kLHS};
  Tensor qkv = m.F32({kLB, kLT, heads.qkv_width()}, 1.f), inv_freq = m.F32({kLHS / 2});
  for (auto _ : s) ops->RopeForward(qkv, heads, inv_freq);
  SetBytes(s, 8.0 * kLN * (kLNH + kLNKV) * kLHS);
}

void BM_SwiGluForward(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  Tensor gate = m.F32({kLN, kLFF}, 1.f), up = m.F32({kLN, kLFF}), h = m.F32({kLN, kLFF});
  for (auto _ : s) ops->SwiGluForward(gate, up, h);
  SetBytes(s, 12.0 * kLN * kLFF);
}

void BM_SwiGluBackward(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  Tensor gate = m.F32({kLN, kLFF}, 1.f), up = m.F32({kLN, kLFF}), dh = m.F32({kLN, kLFF});
  Tensor dgate = m.F32({kLN, kLFF}), dup = m.F32({kLN, kLFF});
  for (auto _ : s) ops->SwiGluBackward(dh, gate, up, dgate, dup);
  SetBytes(s, 20.0 * kLN * kLFF);
}

void BM_LayerNormForward(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  Tensor x = m.F32({kN, kC}), w = m.F32({kC}), b = m.F32({kC}), y = m.F32({kN, kC});
  Tensor mean = m.F32({kN}), rstd = m.F32({kN});
  for (auto _ : s) ops->LayerNormForward(x, w, b, y, mean, rstd);
  SetBytes(s, 8.0 * kN * kC);
}

void BM_GeluForward(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  Tensor x = m.F32({kN, 4 * kC}), y = m.F32({kN, 4 * kC});
  for (auto _ : s) ops->GeluForward(x, y);
  SetBytes(s, 8.0 * kN * 4 * kC);
}

void BM_SoftmaxCrossEntropyWithGrad(benchmark::State& s) {
  auto ops = ztrain::kernels::MakeCpuOps();
  Arena m;
  Tensor logits = m.F32({kN, kVp}, 1.f), losses = m.F32({kN}), dlosses = m.F32({kN});
  std::vector<int32_t> targets(kN, 7);
  const Tensor t(targets.data(), DType::kI32, {kN});
  for (auto _ : s) ops->SoftmaxCrossEntropy(logits, t, kV, losses, dlosses);
  SetBytes(s, 8.0 * kN * kVp);
}

}  // namespace

BENCHMARK(BM_SgemmPeak2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_StreamTriad)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LinearForwardQkv)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LinearBackwardQkv)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LmHeadForward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AttentionForward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AttentionBackward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LayerNormForward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LlamaAttentionForward)
    ->Arg(kLNKV)
    ->Arg(kLNH)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_LlamaAttentionBackward)
    ->Arg(kLNKV)
    ->Arg(kLNH)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_RmsNormForward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RmsNormBackward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RopeForward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SwiGluForward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SwiGluBackward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GeluForward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SoftmaxCrossEntropyWithGrad)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
