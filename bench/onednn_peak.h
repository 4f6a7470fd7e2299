#pragma once
// OneDnnPeak: the bf16 matmul rate oneDNN itself reaches on this machine, the reference the
// benchmarks hold bf16 work against (bf16_gemm_bench per GEMM, the step benchmarks per step).
//
// Owns one oneDNN matmul primitive of n x n x n, bf16 x bf16 -> fp32 (row-major, created with
// the primitive's own defaults, called directly rather than through CpuOps), and its operands
// (random values, 4 n^2 bytes of bf16 and 4 n^2 of fp32). Measure() may be called any number
// of times, e.g. before and after the work it is compared with; best() keeps the highest
// rate, so that a burst of load from elsewhere during one measurement does not flatter a
// ratio. Without oneDNN in the build, available() is false and Measure() returns 0. A oneDNN
// failure throws dnnl::error. Not thread safe; oneDNN runs on OMP_NUM_THREADS threads.
#include <cstdint>
#include <memory>
#include <string>

namespace ztrain::bench {

class OneDnnPeak {
 public:
  explicit OneDnnPeak(int64_t n);
  ~OneDnnPeak();
  OneDnnPeak(const OneDnnPeak&) = delete;
  OneDnnPeak& operator=(const OneDnnPeak&) = delete;

  bool available() const { return impl_ != nullptr; }
  int64_t size() const { return n_; }
  // oneDNN's name for the implementation it picked ("brg:avx512_core_bf16"); empty without
  // oneDNN.
  const std::string& impl_name() const { return impl_name_; }
  double best() const { return best_; }
  // GFLOP/s of the fastest of `reps` runs after a warm-up.
  double Measure(int reps);

 private:
  struct Impl;
  int64_t n_;
  std::string impl_name_;
  double best_ = 0.0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ztrain::bench
