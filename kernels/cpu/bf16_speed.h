#pragma once
// Whether bf16 pays on this CPU, measured: oneDNN's bf16 matmul against OpenBLAS's SGEMM on a
// model's own GEMM shape.
//
// Note [bf16 where it pays]: AVX512-BF16 in cpuid does not make bf16 fast. On an Intel Xeon
// with AVX512-BF16 and AVX512-FP16, oneDNN 2.6's bf16 matmul reached 137.5 GFLOP/s against
// SGEMM's 230, so a bf16 run was 1.37x slower than fp32, while on an AMD EPYC it reaches
// 2.1x SGEMM. So "auto" for bf16 on the CPU times both on the shape of the model's MLP
// GEMM (1024 rows; the model's width by its MLP width, each within [512, 4096]) for a few
// repetitions each, best kept, and takes bf16 only when it is at least kBf16Pays times fp32's
// rate. fp32's rate is that of the backend an fp32 run would use for the shape (Note [GEMMs
// chosen by measurement]: oneDNN's fp32 matmul where it beats SGEMM by the margin, or what
// ZTRAIN_FP32_GEMM says); an explicit bf16.enabled true that measures slower than fp32 is warned
// about with the ratio. Where bf16 does not pay, "auto" still takes it when only the bf16 run
// fits the rank's memory (run/run_config.h, Bf16ForTheRun). The measurement takes a few
// tens of milliseconds; ranks that measure differently agree on fp32 (Note [One config on
// every rank]).
#include <cstdint>
#include <string>

namespace ztrain::kernels {

// bf16 must be this much faster than fp32 to be chosen: below it, timing noise and bf16's
// conversions decide, and fp32 keeps the precision.
inline constexpr double kBf16Pays = 1.1;

struct Bf16Speed {
  bool available = false;  // oneDNN bf16 matmuls run here at all (CpuHasBf16)
  double fp32_gflops = 0.0, bf16_gflops = 0.0;
  const char* fp32_backend = "OpenBLAS";  // what fp32_gflops was measured on
  int64_t m = 0, n = 0, k = 0;  // the shape timed
  std::string detail;           // why not available, or the ISA oneDNN runs
  double ratio() const { return fp32_gflops > 0 ? bf16_gflops / fp32_gflops : 0.0; }
};

// Times the GEMM [m, k] x [k, n] in fp32 (SGEMM and oneDNN's fp32 matmul, keeping the one an
// fp32 run would use) and bf16 (oneDNN, fp32 out) on this process's threads. `width`, `mlp_width`:
// the model's n_embd and MLP width.
Bf16Speed MeasureBf16Speed(int64_t width, int64_t mlp_width);

// Note [bf16 where it pays] as a function of the measurement: whether to train in bf16, and a
// sentence saying why with the figures.
bool Bf16Pays(const Bf16Speed& speed, std::string* why);

}  // namespace ztrain::kernels
