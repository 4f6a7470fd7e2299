#pragma once
// The cores' physical limit for the step benches: how many fp32 FMAs (and AVX512-BF16 dot
// products, vdpbf16ps) the cores retire a second from a loop that touches no memory. Each
// thread keeps 16 independent accumulators in registers (enough to cover the FMA latency on
// both ports of every x86 core the project meets) and counts 2 FLOPs per fp32 lane per FMA,
// and 4 per fp32 lane per vdpbf16ps (two bf16 products and their sums into each lane), the
// convention GEMM FLOP counts use. AVX-512 where the CPU has it, else AVX2 + FMA; bf16 only
// with AVX512-BF16 (0 otherwise). No GEMM can beat these figures; the GEMM peaks say how much
// of them a library reaches.
#include <string>

namespace ztrain::bench {

struct FmaLimit {
  double fp32_gflops = 0.0;
  double bf16_gflops = 0.0;  // 0: the CPU has no AVX512-BF16
  std::string isa;           // "AVX-512", "AVX2"
};

// Runs the loops on `threads` OpenMP threads for about `seconds` each, best of 3.
FmaLimit MeasureFmaLimit(int threads, double seconds = 0.2);

}  // namespace ztrain::bench
