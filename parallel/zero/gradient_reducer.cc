#include "parallel/zero/gradient_reducer.h"

#include <utility>

#include "core/error.h"

namespace ztrain::zero {

ReducePolicy ReducePolicyFor(int stage, bool reduce_scatter) {
  if (stage == 0) return ReducePolicy::kAllReduce;
  if (!reduce_scatter) return ReducePolicy::kAllReduceSlice;
  return stage == 1 ? ReducePolicy::kScatterInto : ReducePolicy::kScatterAdd;
}

GradientReducer::GradientReducer(Options options, std::vector<ReduceRange> ranges,
                                 comm::Communicator& dp, kernels::Ops& ops, Allocator& scratch,
                                 ReducerHooks hooks)
    : options_(options),
      ranges_(std::move(ranges)),
      dp_(dp),
      ops_(ops),
      scratch_(scratch),
      hooks_(std::move(hooks)),
      layers_(ranges_.size()) {}

GradientReducer::~GradientReducer() {
  for (Layer& layer : layers_) {
    if (!layer.work) continue;
    try {
      layer.work->Wait();
    } catch (const std::exception&) {
    }
  }
}

void GradientReducer::Ready(size_t l) {
  ZTRAIN_ASSERT(l < ranges_.size());
  if (ranges_[l].padded > 0) {
    pending_.push_back(l);
    pending_elements_ += ranges_[l].padded;
  }
  if (pending_elements_ >= options_.bucket_elements || l == 0) Launch();
}

void GradientReducer::Launch() {
  // Scattering with accumulation keeps at most two buckets' full gradients: the previous
  // bucket lands (and releases them) before the next launches.
  if (options_.accumulate) Finish();
  for (size_t l : pending_) {
    const ReduceRange& r = ranges_[l];
    Layer& layer = layers_[l];
    const Tensor grads = hooks_.gradients(l, layer.staging);
    layer.whole = grads;
    switch (options_.policy) {
      case ReducePolicy::kAllReduce:
      case ReducePolicy::kAllReduceSlice:
        layer.work = dp_.AllReduce(grads);
        break;
      case ReducePolicy::kScatterInto:
        layer.work = dp_.ReduceScatter(grads, hooks_.shard(l));
        break;
      case ReducePolicy::kScatterAdd:
        layer.received = Buffer(scratch_, DType::kF32, {r.shard}, MemoryCategory::kCommunication);
        layer.work = dp_.ReduceScatter(grads, layer.received.AsTensor(DType::kF32, {r.shard}));
        break;
    }
    launched_.push_back(l);
  }
  if (!pending_.empty()) ++buckets_;
  pending_.clear();
  pending_elements_ = 0;
  if (!options_.overlap) Finish();
}

void GradientReducer::Finish() {
  for (size_t l : launched_) {
    const ReduceRange& r = ranges_[l];
    Layer& layer = layers_[l];
    if (options_.wait) {
      options_.wait(*layer.work);
    } else {
      layer.work->Wait();
    }
    // kAllReduce and kScatterInto reduced where the result belongs; the other two land it.
    Tensor reduced;
    switch (options_.policy) {
      case ReducePolicy::kAllReduce:
      case ReducePolicy::kScatterInto:
        break;
      case ReducePolicy::kScatterAdd:
        reduced = layer.received.AsTensor(DType::kF32, {r.shard});
        break;
      case ReducePolicy::kAllReduceSlice:  // the whole layer: the rank's range is a slice
        reduced = layer.whole.Flat(r.opt_begin, {r.shard});
        break;
    }
    if (reduced.data() != nullptr && options_.accumulate) {
      ops_.AddInPlace(hooks_.shard(l), reduced);
    } else if (reduced.data() != nullptr) {
      ops_.Copy(reduced, hooks_.shard(l));
    }
    if (options_.accumulate) hooks_.release(l);
    layer = Layer();
  }
  launched_.clear();
}

}  // namespace ztrain::zero
