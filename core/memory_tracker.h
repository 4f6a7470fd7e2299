#pragma once
// MemoryTracker: current and peak bytes per category, for one kind of memory.
//
// Every allocator reports to a tracker; the engine owns its trackers and passes them
// explicitly (there is no global tracker). A tracker made with a parent passes every
// allocation on to it as well, so one tracker per kind of memory (device, host, pinned host)
// adds up into one for all of it. Thread safe: counters are atomics, so allocations from
// worker threads (communication, I/O) are counted too. Peak is tracked per category and for
// the total (the total peak is not the sum of category peaks).
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ztrain {

enum class MemoryCategory : int {
  kParameters,
  kGradients,
  kOptimizerState,
  kActivations,
  kCommunication,
  kSwapBuffers,
  kWorkspace,
};
inline constexpr int kNumMemoryCategories = 7;
std::string_view MemoryCategoryName(MemoryCategory c);

struct MemorySnapshot {
  std::array<int64_t, kNumMemoryCategories> current{};
  std::array<int64_t, kNumMemoryCategories> peak{};
  int64_t total_current = 0;
  int64_t total_peak = 0;
  int64_t Current(MemoryCategory c) const { return current[static_cast<int>(c)]; }
  int64_t Peak(MemoryCategory c) const { return peak[static_cast<int>(c)]; }
  std::string ToJson() const;
};

class MemoryTracker {
 public:
  // `parent` (not owned; it must outlive this tracker) counts everything this one counts.
  explicit MemoryTracker(MemoryTracker* parent = nullptr) : parent_(parent) {}
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;
  void Allocated(MemoryCategory c, int64_t bytes);
  void Freed(MemoryCategory c, int64_t bytes);
  int64_t Current(MemoryCategory c) const { return current_[Index(c)].load(); }
  int64_t Peak(MemoryCategory c) const { return peak_[Index(c)].load(); }
  int64_t TotalCurrent() const { return total_.load(); }
  int64_t TotalPeak() const { return total_peak_.load(); }
  // Restarts peaks from the current values (e.g. after start-up, to measure steady state);
  // the parent's stay.
  void ResetPeaks();
  MemorySnapshot Snapshot() const;

 private:
  static int Index(MemoryCategory c) { return static_cast<int>(c); }
  static void RaiseTo(std::atomic<int64_t>& peak, int64_t value);
  MemoryTracker* parent_;
  std::array<std::atomic<int64_t>, kNumMemoryCategories> current_{};
  std::array<std::atomic<int64_t>, kNumMemoryCategories> peak_{};
  std::atomic<int64_t> total_{0};
  std::atomic<int64_t> total_peak_{0};
};

// "1.50 GiB" style formatting for reports.
std::string FormatBytes(int64_t bytes);

}  // namespace ztrain
