#include "parallel/zero/gather_plan.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace ztrain::zero {
namespace {

constexpr size_t kNever = std::numeric_limits<size_t>::max();

// Walks the positions, keeping the set of live units and the element counts the limits
// are about.
class Planner {
 public:
  Planner(std::span<const int64_t> sizes, std::span<const UnitUse> uses, const GatherLimits& limits)
      : sizes_(sizes),
        uses_(uses),
        limits_(limits),
        live_(sizes.size(), false),
        prefetched_(sizes.size(), false) {
    for (const UnitUse& use : uses) {
      for (size_t i = 0; i < use.size(); ++i) {
        ZTRAIN_CHECK(use[i] < sizes.size(), "gather plan: unit ", use[i], " of ", sizes.size(),
                     " does not exist");
        ZTRAIN_CHECK(std::find(use.begin(), use.begin() + i, use[i]) == use.begin() + i,
                     "gather plan: unit ", use[i], " appears twice in one position");
      }
    }
  }

  GatherPlan Run() {
    GatherPlan plan;
    plan.actions.resize(uses_.size());
    for (size_t p = 0; p < uses_.size(); ++p) {
      GatherAction& action = plan.actions[p];
      for (size_t u : uses_[p]) {
        if (prefetched_[u]) {
          prefetched_[u] = false;
          window_ -= sizes_[u];
        }
        if (!live_[u]) Fetch(u, action);
      }
      Prefetch(p, action);
      plan.peak_live = std::max(plan.peak_live, live_total_ + persistent_total_);
      Release(p, action);
    }
    if (!plan.actions.empty()) {
      for (size_t u = 0; u < live_.size(); ++u) {
        if (live_[u]) Drop(u, plan.actions.back());
      }
    }
    return plan;
  }

 private:
  bool Persistent(size_t u) const { return sizes_[u] < limits_.persistence_threshold; }

  void Fetch(size_t u, GatherAction& action) {
    live_[u] = true;
    (Persistent(u) ? persistent_total_ : live_total_) += sizes_[u];
    action.fetch.push_back(u);
  }

  void Drop(size_t u, GatherAction& action) {
    live_[u] = false;
    (Persistent(u) ? persistent_total_ : live_total_) -= sizes_[u];
    action.release.push_back(u);
  }

  // Gathers the units of the positions after p, in order, while they fit the limits.
  void Prefetch(size_t p, GatherAction& action) {
    for (size_t q = p + 1; q < uses_.size(); ++q) {
      for (size_t u : uses_[q]) {
        if (live_[u]) continue;
        const int64_t counted = Persistent(u) ? 0 : sizes_[u];
        if (window_ + sizes_[u] > limits_.prefetch_bucket ||
            live_total_ + counted > limits_.max_live) {
          return;
        }
        Fetch(u, action);
        prefetched_[u] = true;
        window_ += sizes_[u];
      }
    }
  }

  // The next position after p that uses u, or kNever.
  size_t NextUse(size_t u, size_t p) const {
    for (size_t q = p + 1; q < uses_.size(); ++q) {
      if (std::find(uses_[q].begin(), uses_[q].end(), u) != uses_[q].end()) return q;
    }
    return kNever;
  }

  // Elements of parameters used strictly between positions p and q.
  int64_t Distance(size_t p, size_t q) const {
    int64_t d = 0;
    for (size_t i = p + 1; i < q; ++i) {
      for (size_t u : uses_[i]) d += sizes_[u];
    }
    return d;
  }

  void Release(size_t p, GatherAction& action) {
    // Units reused soon are candidates to keep, the soonest reused first.
    std::vector<std::pair<size_t, size_t>> keep;  // (next use, unit)
    for (size_t u : uses_[p]) {
      if (Persistent(u)) continue;
      const size_t next = NextUse(u, p);
      if (next != kNever && Distance(p, next) <= limits_.max_reuse_distance) {
        keep.emplace_back(next, u);
      } else {
        Drop(u, action);
      }
    }
    std::sort(keep.begin(), keep.end());
    while (!keep.empty() && live_total_ > limits_.max_live) {
      Drop(keep.back().second, action);
      keep.pop_back();
    }
  }

  std::span<const int64_t> sizes_;
  std::span<const UnitUse> uses_;
  GatherLimits limits_;
  std::vector<bool> live_;
  std::vector<bool> prefetched_;  // gathered ahead of its position, not yet used
  int64_t live_total_ = 0;        // live elements of units that are not persistent
  int64_t persistent_total_ = 0;  // live elements of persistent units
  int64_t window_ = 0;            // elements prefetched and not yet used
};

}  // namespace

GatherPlan PlanGathers(std::span<const int64_t> unit_sizes, std::span<const UnitUse> uses,
                       const GatherLimits& limits) {
  return Planner(unit_sizes, uses, limits).Run();
}

}  // namespace ztrain::zero
