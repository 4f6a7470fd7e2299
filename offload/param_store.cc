#include "offload/param_store.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace ztrain::offload {

// Adds the wall time of its scope to the store's wait for the swapper.
class ParamStore::Waiting {
 public:
  explicit Waiting(double& total) : total_(total) {}
  ~Waiting() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  double& total_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

ParamStore::ParamStore(const Options& options, kernels::Ops& ops, Allocator& staging,
                       Allocator& pageable, Allocate allocate)
    : options_(options),
      ops_(ops),
      staging_(staging),
      pageable_(pageable),
      allocate_(std::move(allocate)) {}

ParamStore::~ParamStore() = default;

void ParamStore::AddLayer(const HeldShape& shape) {
  const Placement& at = options_.placement;
  const bool mixed = options_.compute != DType::kF32;
  Layer& layer = layers_.emplace_back();
  layer.shape = shape;
  if (at.params != Place::kNvme) {  // on NVMe the swapper holds the shard
    layer.params = allocate_(at.params, shape.held(), MemoryCategory::kParameters, DType::kF32);
  }
  if (mixed && !shape.sharded) {
    layer.lp =
        allocate_(Place::kDevice, shape.padded, MemoryCategory::kParameters, options_.compute);
  } else if (mixed && options_.on_device && at.params_in_host()) {
    layer.lp = allocate_(at.params, shape.shard, MemoryCategory::kParameters, options_.compute);
  }
  if (options_.on_device && at.host_adam && at.host_master) {
    layer.master =
        allocate_(Place::kPinned, shape.opt_len, MemoryCategory::kOptimizerState, DType::kF32);
  }
}

void ParamStore::SwapTo(std::unique_ptr<ParamSwapper> swapper,
                        std::shared_ptr<const void> needs) {
  ZTRAIN_ASSERT(options_.placement.params == Place::kNvme);
  swapper_needs_ = std::move(needs);
  swapper_ = std::move(swapper);
}

Tensor ParamStore::HeldTensor(size_t l) const {
  const Layer& layer = layers_[l];
  return layer.params.AsTensor(DType::kF32, {layer.shape.held()});
}

Tensor ParamStore::OptimizerRange(size_t l) const {
  const HeldShape& s = layers_[l].shape;
  return HeldTensor(l).Flat(s.opt_in_held(), {s.opt_len});
}

void ParamStore::Read(size_t l, float* dst) {
  if (!options_.computes) return;
  if (swapper_) {
    swapper_->CopyOut(l, dst);
    return;
  }
  const Tensor held = HeldTensor(l);
  ops_.Copy(held, Tensor(dst, DType::kF32, held.shape()));
  ops_.Synchronize();
}

void ParamStore::Write(size_t l, const float* src) {
  if (!options_.computes) return;
  if (swapper_) {
    swapper_->Store(l, src);
    return;
  }
  Layer& layer = layers_[l];
  const Tensor held = HeldTensor(l);
  ops_.Copy(Tensor(const_cast<float*>(src), DType::kF32, held.shape()), held);
  if (layer.master.data() != nullptr) {
    std::memcpy(layer.master.data(), src + layer.shape.opt_in_held(),
                static_cast<size_t>(layer.shape.opt_len) * sizeof(float));
  }
  ops_.Synchronize();
}

float* ParamStore::OpenOnHost(size_t l, Buffer& staged, MemoryCategory category, bool current) {
  Layer& layer = layers_[l];
  if (!swapper_ && layer.params.device().is_cpu()) return layer.params.data<float>();
  staged = Buffer(staging_, DType::kF32, {layer.shape.held()}, category);
  if (current) {
    Read(l, staged.data<float>());
  } else {
    staged.Zero();
  }
  return staged.data<float>();
}

void ParamStore::Commit(size_t l, const Buffer& staged) {
  if (staged.data() != nullptr) Write(l, staged.data<float>());
}

float* ParamStore::Acquire(size_t l) {
  Layer& layer = layers_[l];
  if (layer.master.data() != nullptr) return layer.master.data<float>();
  if (!swapper_) return layer.params.data<float>() + layer.shape.opt_in_held();
  const Waiting waiting(wait_seconds_);
  return swapper_->Acquire(l);
}

void ParamStore::Release(size_t l, bool changed) {
  Layer& layer = layers_[l];
  if (layer.master.data() != nullptr) {
    if (!changed) return;
    const Tensor range = OptimizerRange(l);
    ops_.Copy(Tensor(layer.master.data<float>(), DType::kF32, range.shape()), range);
  } else if (swapper_) {
    swapper_->Release(l, changed);
  }
}

// The four places a stage-3 shard can be sent from. Held where the gather runs: the fp32
// shard itself, or its conversion into `mine`. Swapped, gathered in host fp32: read straight
// into `mine`. Otherwise the shard is on the host (a device gathers it): the fp32 master or
// its compute copy as held, or read from NVMe into pageable staging, converted into `mine`
// by the ops when the dtypes differ.
Tensor ParamStore::GatherSource(size_t l, const Tensor& mine, Buffer& staged) {
  const Layer& layer = layers_[l];
  const int64_t shard = layer.shape.shard;
  const DType dtype = mine.dtype();
  if (!swapper_ && layer.params.device() == mine.device()) {
    const Tensor held = HeldTensor(l);
    if (dtype == DType::kF32) return held;
    ops_.Copy(held, mine);  // the compute-dtype copy of the shard, converted into its chunk
    return mine;
  }
  if (swapper_ && mine.device().is_cpu() && dtype == DType::kF32) {
    const Waiting waiting(wait_seconds_);
    swapper_->CopyOut(l, mine.data<float>());
    return mine;
  }
  Tensor source;
  if (!swapper_) {
    source = dtype == DType::kF32 || layer.lp.data() == nullptr ? HeldTensor(l)
                                                                : layer.lp.AsTensor(dtype, {shard});
  } else {
    staged = Buffer(pageable_, DType::kF32, {shard}, MemoryCategory::kWorkspace);
    const Waiting waiting(wait_seconds_);
    swapper_->CopyOut(l, staged.data<float>());
    source = staged.AsTensor(DType::kF32, {shard});
  }
  if (source.dtype() == dtype) return source;
  ops_.Copy(source, mine);  // NVMe under mixed precision
  ops_.Synchronize();       // before `staged` goes
  return mine;
}

void ParamStore::RefreshComputeCopies() {
  for (Layer& layer : layers_) {
    if (layer.lp.data() == nullptr)
      continue;  // none, or stage 3 on the device: converted at
                 // each gather
    const int64_t n = layer.shape.held();
    ops_.Copy(layer.params.AsTensor(DType::kF32, {n}), layer.lp.AsTensor(options_.compute, {n}));
  }
}

void ParamStore::Prefetch(size_t l) {
  if (swapper_) swapper_->Prefetch(l);
}

void ParamStore::Flush() {
  if (!swapper_) return;
  const Waiting waiting(wait_seconds_);
  swapper_->Flush();
}

}  // namespace ztrain::offload
