#pragma once
// The honesty rule of the memory estimate, shared by estimate_test (one process, every ZeRO
// stage and offload mode) and layout_equivalence_test (each rank of a dp x pp x tp layout):
// |estimate - measured| <= max(10% of measured, 4 KiB) for every MemoryCategory and for the
// total. The absolute slack is for categories of a few bytes (the communication buffers of a
// layer shard).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/memory_tracker.h"
#include "estimate/estimate.h"

namespace ztrain::testing {

inline constexpr int64_t kEstimateSlackBytes = 4096;
inline constexpr double kEstimateSlackShare = 0.10;

// Checks `e` against the tracker's peaks `m`, printing a line per category. `slack_bytes`
// replaces the absolute slack where the categories are all small (the tiny models of the
// layout tests).
inline void ExpectEstimateHonest(const MemoryEstimate& e, const MemorySnapshot& m,
                                 const std::string& label,
                                 int64_t slack_bytes = kEstimateSlackBytes) {
  const auto check = [&](const std::string& what, int64_t estimate, int64_t measured) {
    const double slack =
        std::max<double>(slack_bytes, kEstimateSlackShare * static_cast<double>(measured));
    EXPECT_LE(std::abs(static_cast<double>(estimate - measured)), slack)
        << label << " " << what << ": estimate " << estimate << ", measured " << measured;
    std::printf("  %-26s %-16s measured %10lld  estimate %10lld  ratio %.4f\n", label.c_str(),
                what.c_str(), static_cast<long long>(measured), static_cast<long long>(estimate),
                measured == 0 ? (estimate == 0 ? 1.0 : 0.0)
                              : static_cast<double>(estimate) / static_cast<double>(measured));
  };
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    const auto cat = static_cast<MemoryCategory>(c);
    check(std::string(MemoryCategoryName(cat)), e.Peak(cat), m.Peak(cat));
  }
  check("total", e.total_peak, m.total_peak);
}

}  // namespace ztrain::testing
