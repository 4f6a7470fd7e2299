#pragma once
// ZeRO stage 3 parameter gathering as data: which flat buffers to all-gather before each
// layer runs and which to release after (DESIGN.md "ZeRO-3 needs no tracing").
//
// The engine knows the order its layers run in — forward 0..n-1, then backward n-1..0, for
// every micro-batch of a step — so the whole step is known up front as a list of positions,
// each needing some units (a layer's flat parameter buffer, plus the buffers of earlier
// layers whose parameters it ties to). PlanGathers walks that list once and decides, within
// DeepSpeed's stage 3 limits, when each unit is gathered and released:
//   - the units of the position about to run are gathered if they are not live (always: a
//     layer cannot run without its parameters);
//   - then units of the following positions are prefetched, in order, while the prefetched
//     and not yet used elements stay within `prefetch_bucket` and all live elements within
//     `max_live` (the first unit that does not fit ends the prefetch, so order is kept);
//   - after a position runs, each of its units is released unless it is used again within
//     `max_reuse_distance` elements of other parameter use and keeping it leaves the live
//     elements within `max_live`, or it is persistent (fewer elements than
//     `persistence_threshold`: kept gathered until the end of the step, outside `max_live`);
//   - after the last position everything is released.
// So at any time the gathered elements are at most max_live + the current position's units
// + the persistent units. ztrain's unit is the layer, so the thresholds compare with whole
// layers, where DeepSpeed compares with single parameters.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ztrain::zero {

struct GatherLimits {
  int64_t prefetch_bucket = 50000000;     // stage3_prefetch_bucket_size
  int64_t max_live = 1000000000;          // stage3_max_live_parameters
  int64_t max_reuse_distance = 1000000000;  // stage3_max_reuse_distance
  int64_t persistence_threshold = 100000;   // stage3_param_persistence_threshold
};

// The units one position (one layer's forward or backward) needs, without repeats.
using UnitUse = std::vector<size_t>;

struct GatherAction {
  std::vector<size_t> fetch;    // gather these, in this order, before the position runs
  std::vector<size_t> release;  // release these after it ran
};

struct GatherPlan {
  std::vector<GatherAction> actions;  // one per position
  int64_t peak_live = 0;              // most elements gathered at once, persistent included
};

// `unit_sizes[u]` is unit u's element count (as gathered: padded). Every unit named in
// `uses` must exist; a unit may appear in any number of positions.
GatherPlan PlanGathers(std::span<const int64_t> unit_sizes, std::span<const UnitUse> uses,
                       const GatherLimits& limits);

}  // namespace ztrain::zero
