#pragma once
// Timing and STREAM-style memory-bandwidth helpers shared by the benchmarks.
//
// Bandwidth follows STREAM's convention: bytes the kernel names (copy: 1 read + 1 write,
// triad: 2 reads + 1 write per element), not the extra read a write-allocate cache makes.
// Arrays are page-aligned and first touched by the OpenMP threads that use them (static
// schedule), as the library's own loops are. Nothing here is thread safe across callers.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace ztrain::bench {

class Timer {
 public:
  Timer() : start_(std::chrono::steady_clock::now()) {}
  void Reset() { start_ = std::chrono::steady_clock::now(); }
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// Runs fn() once to warm up (page faults, caches, thread pool), then `reps` more times, and
// returns the fastest of those in seconds: on a shared machine the minimum is the run least
// disturbed by others.
template <typename Fn>
double BestOf(int reps, Fn&& fn) {
  fn();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < reps; ++r) {
    Timer t;
    fn();
    const double s = t.Seconds();
    if (s < best) best = s;
  }
  return best;
}

inline double GBs(double bytes, double seconds) { return bytes / seconds * 1e-9; }

// The median over passes of ztrain's rate over the reference's rate in the same pass (pairs
// whose reference is not positive are left out); -1 when none is left. Less sensitive to a
// disk whose speed drifts than the ratio of the bests.
double PairedMedianRatio(const std::vector<double>& ztrain, const std::vector<double>& reference);

// Runs `command` through the shell and returns what it wrote to stdout (stderr passes
// through); *status receives pclose's status (-1 when the command could not start).
std::string CommandOutput(const std::string& command, int* status);

// Environment assignments that make glibc keep freed memory in its heap instead of serving
// every large temporary from a fresh mmap whose pages fault in on first touch, which on this
// VM costs more than PyTorch's arithmetic on them (what a caching allocator would give it).
// The PyTorch references run with and without it and the faster figure is the one compared.
inline constexpr const char* kKeepHeapEnv =
    "MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736";

// Whether `python` (an interpreter's path) can import torch.
bool PythonHasTorch(const std::string& python);

// Whether the fio command runs here.
bool HaveFio();
// Runs `fio <args> --rw=<rw> --output-format=json` and returns the job's bandwidth for `rw`
// ("read" or "write") in GB/s, or < 0 with *error set (fio failed, or its JSON is broken).
double FioGBs(const std::string& args, const std::string& rw, std::string* error);

// The file system holding `dir`, by statfs's magic: "ext4", "tmpfs", "xfs", "btrfs",
// "fs type 0x..." for another, "unknown" where statfs fails. The I/O benches print it and
// warn on tmpfs, where files live in memory and figures say nothing of a disk.
std::string FileSystemName(const std::string& dir);

// The median of `v` (the mean of the middle two for an even count); v must not be empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A page-aligned float array, zero-filled in parallel with schedule(static) so that each
// thread's part is first touched (and placed) by that thread.
class FloatArray {
 public:
  explicit FloatArray(size_t n);
  float* data() const { return data_.get(); }
  size_t size() const { return n_; }
  float& operator[](size_t i) const { return data_[i]; }

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::unique_ptr<float[], Free> data_;
  size_t n_;
};

// STREAM copy (a[i] = b[i]) and triad (a[i] = b[i] + s * c[i]) over arrays of `n_floats`
// each, best of `reps` after a warm-up, in GB/s.
double StreamCopyGBs(size_t n_floats, int reps = 5);
double StreamTriadGBs(size_t n_floats, int reps = 5);

}  // namespace ztrain::bench
