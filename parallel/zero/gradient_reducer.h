#pragma once
// Note [Gradient reducer]
// ZeRO's gradient reduction over the data-parallel group, in buckets (Note [ZeRO in the
// engine], engine/engine_state.h, has the whole story; this is its communication part):
//   - a layer whose gradients are final (Ready) joins the pending bucket, which is launched
//     once it holds `bucket_elements` elements or layer 0 is ready (backward's last layer);
//   - without `overlap` every bucket is waited for at once; with it the reductions run while
//     backward goes on, until Finish;
//   - what a reduction does is the stage's policy, chosen once when the reducer is built:
//       kAllReduce       (stage 0) the whole layer is all-reduced in place;
//       kScatterInto     (stage 1) reduce-scattered straight into the rank's gradient shard;
//       kScatterAdd      (stages 2, 3) reduce-scattered into a receive buffer that is added
//                        into the shard (every micro-batch reduces; the shard accumulates);
//       kAllReduceSlice  (stages 1-3 with reduce_scatter false) all-reduced in place, and the
//                        rank's slice copied (stage 1) or added (2, 3) into the shard;
//   - at stages 2 and 3 the previous bucket is finished (and its full gradients released)
//     before the next one launches, so at most two buckets' full gradients exist at a time.
// The reducer owns only what it communicates through: the fp32 copies of 16-bit gradients it
// reduces, the receive buffers and the work in flight. The layers' full gradients and the
// shards belong to the caller, reached through the hooks. A layer of no trainable elements
// (padded 0) is never reduced.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/allocator.h"
#include "core/buffer.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "parallel/comm/communicator.h"

namespace ztrain::zero {

enum class ReducePolicy { kAllReduce, kScatterInto, kScatterAdd, kAllReduceSlice };

// The policy of ZeRO `stage` with zero_optimization.reduce_scatter.
ReducePolicy ReducePolicyFor(int stage, bool reduce_scatter);

struct ReduceRange {
  int64_t padded = 0;  // the layer's flat gradient elements (dp x shard)
  int64_t shard = 0;   // the rank's range, [opt_begin, opt_begin + shard)
  int64_t opt_begin = 0;
};

struct ReducerHooks {
  // Layer l's gradients as fp32, `padded` elements, to be reduced in place: the full buffer
  // itself, or a copy of 16-bit ones the hook makes in `staging` (which the reducer keeps
  // until the reduction has landed) or in the shard (kAllReduce).
  std::function<Tensor(size_t l, Buffer& staging)> gradients;
  // Layer l's reduced range (fp32, `shard` elements; unused with kAllReduce).
  std::function<Tensor(size_t l)> shard;
  // With Options::accumulate (stages 2, 3): layer l's full gradients are no longer needed.
  std::function<void(size_t l)> release;
};

class GradientReducer {
 public:
  struct Options {
    ReducePolicy policy = ReducePolicy::kAllReduce;
    bool accumulate = false;         // add into the shard (stages 2, 3), else replace it
    bool overlap = true;             // leave reductions running until Finish
    int64_t bucket_elements = 0;     // a bucket is launched once it holds this many
    // Waits for one reduction (the engine's WaitFor, which times it); unset: Work::Wait.
    std::function<void(comm::Work&)> wait;
  };
  // `scratch` gives the receive and staging buffers (MemoryCategory::kCommunication).
  GradientReducer(Options options, std::vector<ReduceRange> ranges, comm::Communicator& dp,
                  kernels::Ops& ops, Allocator& scratch, ReducerHooks hooks);
  // Waits for the reductions in flight (they write into the caller's buffers), reporting no
  // error: those were or will be reported elsewhere.
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Layer l's gradients are final for this reduction (backward ran through it).
  void Ready(size_t l);
  // Waits for every launched reduction and lands it in the shards.
  void Finish();
  // Buckets launched since construction.
  int64_t buckets() const { return buckets_; }

 private:
  struct Layer {
    Buffer staging;      // fp32 copy of 16-bit gradients being reduced
    Buffer received;     // kScatterAdd: the reduced range before it is added
    Tensor whole;        // what was handed to the collective (the layer's fp32 gradients)
    comm::WorkPtr work;  // the reduction in flight
  };
  void Launch();

  const Options options_;
  const std::vector<ReduceRange> ranges_;
  comm::Communicator& dp_;
  kernels::Ops& ops_;
  Allocator& scratch_;
  const ReducerHooks hooks_;
  std::vector<Layer> layers_;
  std::vector<size_t> pending_, launched_;
  int64_t pending_elements_ = 0;
  int64_t buckets_ = 0;
};

}  // namespace ztrain::zero
