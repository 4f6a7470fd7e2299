#include "core/memory_tracker.h"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace ztrain {

std::string_view MemoryCategoryName(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kParameters: return "parameters";
    case MemoryCategory::kGradients: return "gradients";
    case MemoryCategory::kOptimizerState: return "optimizer_state";
    case MemoryCategory::kActivations: return "activations";
    case MemoryCategory::kCommunication: return "communication";
    case MemoryCategory::kSwapBuffers: return "swap_buffers";
    case MemoryCategory::kWorkspace: return "workspace";
  }
  return "?";
}

void MemoryTracker::RaiseTo(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load();
  while (value > seen && !peak.compare_exchange_weak(seen, value)) {
  }
}

void MemoryTracker::Allocated(MemoryCategory c, int64_t bytes) {
  RaiseTo(peak_[Index(c)], current_[Index(c)].fetch_add(bytes) + bytes);
  RaiseTo(total_peak_, total_.fetch_add(bytes) + bytes);
  if (parent_) parent_->Allocated(c, bytes);
}

void MemoryTracker::Freed(MemoryCategory c, int64_t bytes) {
  current_[Index(c)].fetch_sub(bytes);
  total_.fetch_sub(bytes);
  if (parent_) parent_->Freed(c, bytes);
}

void MemoryTracker::ResetPeaks() {
  for (int i = 0; i < kNumMemoryCategories; ++i) peak_[i].store(current_[i].load());
  total_peak_.store(total_.load());
}

MemorySnapshot MemoryTracker::Snapshot() const {
  MemorySnapshot s;
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    s.current[i] = current_[i].load();
    s.peak[i] = peak_[i].load();
  }
  s.total_current = total_.load();
  s.total_peak = total_peak_.load();
  return s;
}

std::string MemorySnapshot::ToJson() const {
  nlohmann::json j;
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    j[std::string(MemoryCategoryName(static_cast<MemoryCategory>(i)))] = {
        {"current", current[i]}, {"peak", peak[i]}};
  }
  j["total"] = {{"current", total_current}, {"peak", total_peak}};
  return j.dump(2);
}

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace ztrain
