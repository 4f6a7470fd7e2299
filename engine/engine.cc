#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "checkpoint/trained_state.h"
#include "core/logging.h"
#include "engine/activation_checkpointing.h"
#include "engine/engine_impl.h"
#include "engine/engine_state.h"
#include "engine/whole_params.h"
#include "estimate/shape_only.h"
#include "kernels/cuda_memory.h"
#include "nn/init.h"
#include "offload/nvme_offload.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/frozen_regions.h"
#include "parallel/zero/param_table.h"

namespace ztrain {

EngineImpl::EngineImpl(Config config, std::vector<std::unique_ptr<nn::Layer>> layers,
                       ParallelGroups groups, InitialParameters initial)
    : EngineImpl(std::move(config), std::move(layers), groups, initial, nullptr) {}

EngineImpl::EngineImpl(Config config, std::vector<std::unique_ptr<nn::Layer>> layers,
                       ParallelGroups groups, ShapeOnly shape_only)
    : EngineImpl(std::move(config), std::move(layers), groups, InitialParameters::kRandom,
                 &shape_only) {}

EngineImpl::EngineImpl(Config config, std::vector<std::unique_ptr<nn::Layer>> layers,
                       ParallelGroups groups, InitialParameters initial,
                       const ShapeOnly* shape_only)
    : config_(std::move(config)),
      computes_(shape_only == nullptr),
      device_(shape_only ? shape_only->device : ResolveDevice(config_.device)),
      ops_(MakeOps()),
      memory_(device_, computes_, *ops_),
      self_comm_(groups.dp ? nullptr
                           : comm::MakeSelfCommunicator(
                                 [this](const Tensor& a, const Tensor& b) { ops_->Copy(a, b); })),
      dp_(groups.dp ? groups.dp : self_comm_.get()),
      self_pp_(groups.pp ? nullptr : comm::MakeSelfCommunicator()),
      pp_(groups.pp ? groups.pp : self_pp_.get()),
      self_tp_(groups.tp ? nullptr : comm::MakeSelfCommunicator()),
      tp_(groups.tp ? groups.tp : self_tp_.get()),
      zero_(zero::StagePolicyFor(config_.zero.stage, config_.zero.reduce_scatter)),
      // Unsharded gradients are all-reduced behind the last backward, always overlapped.
      overlap_(!zero_.shard_optimizer || config_.zero.overlap_comm),
      placement_(offload::PlaceState(config_.zero, !device_.is_cpu())),
      act_dtype_(ComputeDType(config_)),
      grad_dtype_(GradAccumDType(config_)),
      scaler_(config_.precision.fp16 ? std::make_unique<optim::LossScaler>(
                                           optim::LossScalerOptionsFrom(config_.precision))
                                     : nullptr),
      schedule_(optim::MakeLrSchedule(config_.scheduler, config_.optimizer.lr)),
      param_groups_(config_.optimizer) {
  ZTRAIN_CHECK(!layers.empty(), "the model has no layers");
  if (groups.cp != nullptr && groups.cp->size() > 1) {
    cp_ = groups.cp;
    cp_size_ = groups.cp->size();
    cp_rank_ = groups.cp->rank();
    ZTRAIN_CHECK(dp_->size() % cp_size_ == 0 && dp_->rank() % cp_size_ == cp_rank_,
                 "the gradient group (", dp_->size(),
                 " ranks) is not the dp x cp group of the "
                 "cp group (",
                 cp_size_, " ranks)");
  }
  SelectStage(std::move(layers));
  CheckParamGroups();
  SetUpCheckpointing();
  BuildStorage();
  SetUpReducer();
  SetUpOffload();
  SetUpOptimizer();
  SetUpGatherer();
  if (initial == InitialParameters::kRandom) InitParameters();
}

std::unique_ptr<kernels::Ops> EngineImpl::MakeOps() const {
  if (!computes_) return std::make_unique<detail::ShapeOps>(device_);
  return device_.is_cpu() ? kernels::MakeCpuOps() : kernels::MakeCudaOps(device_.index);
}

EngineImpl::~EngineImpl() {
  // Ops in flight write into buffers about to be freed: gatherer_ and reducer_, destroyed
  // before the layers' buffers, wait for their own.
}

// The stores of parameters, m and v, and frozen regions, empty, and the parameter table they
// are filled by.
void EngineImpl::SetUpStores() {
  // The stores allocate where the placement says through the engine's trackers.
  const offload::ParamStore::Allocate allocate = [this](Place where, int64_t elements,
                                                        MemoryCategory category, DType dtype) {
    return memory_.State(where, elements, category, dtype);
  };
  held_ = std::make_unique<offload::ParamStore>(
      offload::ParamStore::Options{.placement = placement_,
                                   .on_device = on_device(),
                                   .compute = act_dtype_,
                                   .computes = computes_},
      *ops_, memory_.staging(), memory_.host_memory(), allocate);
  moments_ = std::make_unique<offload::OptimizerStateStore>(placement_.optimizer, *ops_, allocate,
                                                            computes_);
  zero::FrozenHooks frozen_hooks;
  frozen_hooks.allocate = [this](int64_t bytes) {
    return memory_.State(placement_.frozen(), bytes, MemoryCategory::kParameters, DType::kU8);
  };
  frozen_hooks.wait = [this](comm::Work& work) { WaitFor(work); };
  frozen_ = std::make_unique<zero::FrozenRegions>(
      zero::FrozenRegions::Options{
          .compute = act_dtype_, .sharded = zero_.shard_parameters, .computes = computes_},
      *dp_, *ops_, memory_.staging(), memory_.activations(), std::move(frozen_hooks));
  table_ = std::make_unique<zero::ParamTable>(
      zero::ParamTable::Options{
          .dp = dp_->size(),
          .rank = dp_->rank(),
          .shard_optimizer = zero_.shard_optimizer,
          .shard_parameters = zero_.shard_parameters,
          .frozen_element_bytes = static_cast<int64_t>(DTypeSize(act_dtype_)),
          .frozen_bytes = [this](const nn::ParamSpec& spec) { return frozen_->Bytes(spec); }},
      param_groups_);
}

void EngineImpl::BuildStorage() {
  SetUpStores();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const zero::LayerSlots& slots =
        table_->AddLayer(layers_[l]->Name(), layers_[l]->Params(), pipeline_->TieOf(l),
                         pipeline_->split().min_padded[l]);
    const zero::FlatLayout& layout = slots.layout;
    auto state = std::make_unique<LayerState>(layout);
    LayerState& st = *state;
    AllocateState(st);
    std::vector<zero::FrozenParam> frozen;
    for (size_t slot : slots.owned) {
      const Slot& s = table_->slot(slot);
      if (s.frozen()) frozen.push_back({s.spec, s.offset});
    }
    frozen_->AddLayer(layout.frozen_padded, layout.frozen_shard, std::move(frozen));
    states_.push_back(std::move(state));
    BindLayer(l);
  }
  WholeParameters::Hooks hooks;
  hooks.settle = [this] { optimizer_->ApplyPending(); };  // Note [Deferred optimizer step]
  hooks.gather = [this](size_t l, const Buffer& whole) { return LaunchGather(l, whole); };
  hooks.wait = [this](comm::Work& work) { WaitFor(work); };
  whole_ = std::make_unique<WholeParameters>(
      *table_, *held_, *frozen_, *tp_, *ops_,
      WholeParameters::Memory{memory_.activations(), memory_.staging(), memory_.host_memory()},
      on_device(), computes_, std::move(hooks));
}

// A layer's buffers, each where its kind of state lives (Note [State placement],
// offload/placement.h), sized by its layout.
void EngineImpl::AllocateState(LayerState& st) {
  const offload::Placement& at = placement_;
  held_->AddLayer({.padded = st.layout.padded,
                   .shard = st.layout.shard,
                   .opt_begin = st.layout.opt_begin,
                   .opt_len = st.layout.opt_len,
                   .sharded = zero_.shard_parameters});
  if (!zero_.shard_gradients) {
    st.grads =
        memory_.State(Place::kDevice, st.layout.padded, MemoryCategory::kGradients, grad_dtype_);
  }
  moments_->AddLayer(st.layout.opt_len);
  if (zero_.shard_optimizer || grad_dtype_ != DType::kF32) {
    st.grad_shard = memory_.State(Place::kDevice, st.layout.opt_len, MemoryCategory::kGradients);
  }
  if (on_device() && at.host_adam) {
    ZTRAIN_ASSERT(zero_.shard_optimizer);  // offload needs ZeRO 1-3 (config validation)
    st.grad_host = memory_.State(Place::kPinned, st.layout.opt_len, MemoryCategory::kGradients);
  }
}

// Gives layer l views of its parameters and of the full gradient buffers they accumulate
// into (its own, or an earlier layer's for tied parameters). At stages 2 and 3 it runs again
// before each use, once the buffers exist; views of absent buffers stay undefined.
void EngineImpl::BindLayer(size_t l) {
  const Buffer none;  // stage 3 before the gatherer exists (construction)
  std::vector<Tensor> params, grads;
  for (size_t slot : table_->layer(l).bound) {
    const Slot& s = table_->slot(slot);
    const LayerState& owner = *states_[s.layer];
    if (s.frozen()) {  // no gradient (Note [Frozen regions])
      params.push_back(frozen_->View(!zero_.shard_parameters ? frozen_->held(s.layer)
                                     : gatherer_             ? gatherer_->FrozenWhole(s.layer)
                                                             : none,
                                     s.spec, s.offset));
      grads.emplace_back();
      continue;
    }
    // Layers compute with the compute-dtype copy under mixed precision (gathered at stage 3).
    const Buffer& whole = !zero_.shard_parameters
                              ? (mixed() ? held_->compute_copy(s.layer) : held_->held(s.layer))
                          : gatherer_ ? gatherer_->Whole(s.layer)
                                      : none;
    params.push_back(
        whole.data() == nullptr
            ? Tensor()
            : whole.AsTensor(act_dtype_, {owner.layout.padded}).Flat(s.offset, s.spec.shape));
    grads.push_back(owner.grads.data() == nullptr
                        ? Tensor()
                        : owner.grads.AsTensor(grad_dtype_, {owner.layout.padded})
                              .Flat(s.offset, s.spec.shape));
  }
  layers_[l]->Bind(std::move(params), std::move(grads));
}

void EngineImpl::AllocateFullGradients(size_t l) {
  LayerState& st = *states_[l];
  if (st.grads.data() != nullptr) return;
  st.grads =
      Buffer(memory_.activations(), grad_dtype_, {st.layout.padded}, MemoryCategory::kGradients);
  memory_.Zero(st.grads);
}

void EngineImpl::WaitFor(comm::Work& work) {
  const auto start = std::chrono::steady_clock::now();
  work.Wait();
  comm_wait_seconds_ += SecondsBetween(start, std::chrono::steady_clock::now());
}

void EngineImpl::SetUpOffload() {
  // Pinned state so far: the CPU backend's mlock'ed allocations, or CUDA's pinned memory.
  const int64_t unpinned = memory_.unpinned_bytes();
  const std::string in_host = offload::DescribeHostOffload(
      placement_, config_.zero, memory_.pinned().TotalCurrent() - unpinned, unpinned);
  if (computes_ && !in_host.empty()) Log().info(in_host);
  std::vector<int64_t> shards, opt_ranges;
  for (const auto& st : states_) {
    shards.push_back(st->layout.shard);
    opt_ranges.push_back(st->layout.opt_len);
  }
  // The rank's place in the dp x pp x tp grid (its world rank, ProcessGrid's order) names its
  // swap directory, so no two ranks of a job share one; the grid's size tells directories of
  // this run's ranks from those an earlier run with more ranks left (Note [Stale swap
  // directories]).
  const offload::SwapRank rank{
      .job_name = config_.training.job_name,
      .grid_rank = (pp_->rank() * dp_->size() + dp_->rank()) * tp_->size() + tp_->rank(),
      .grid_size = pp_->size() * dp_->size() * tp_->size(),
      .ranks_on_node = config_.ranks_on_node};
  nvme_ = std::make_unique<offload::NvmeOffload>(
      placement_, config_.zero, config_.aio, rank, computes_, shards, opt_ranges,
      memory_.host_memory(), memory_.locked_host(), *held_, *moments_);
  swap_file_bytes_ = nvme_->file_bytes();
  // Note [Deferred optimizer step]: so far on the CPU backend.
  defer_steps_ = held_->swapped() && !on_device();
  const std::string on_nvme = nvme_->Describe(*held_, *moments_);
  if (computes_ && !on_nvme.empty()) {
    Log().info(
        "offload: {}{}", on_nvme,
        defer_steps_ ? "; each layer's optimizer step runs as the next forward reads it" : "");
  }
}

// Checkpoints (Note [Checkpoints in the engine], checkpoint/trained_state.h).
void EngineImpl::SaveState(checkpoint::ShardWriter& writer) {
  optimizer_->ApplyPending();  // Note [Deferred optimizer step]
  checkpoint::SaveTrainedState(
      *table_, *held_, *optimizer_,
      {.sharded_optimizer = zero_.shard_optimizer, .dp_rank = dp_->rank(), .tp_rank = tp_->rank()},
      writer);
}

void EngineImpl::LoadState(const checkpoint::ModelIndex& index, int64_t step) {
  optimizer_->ApplyPending();  // Note [Deferred optimizer step]
  checkpoint::LoadTrainedState(*table_, *held_, *optimizer_, index);
  step_ = step;
}

void EngineImpl::SetUpCheckpointing() {
  std::vector<int> blocks;
  for (const auto& layer : layers_) blocks.push_back(layer->BlockIndex());
  const ActivationCheckpointingConfig& ac = config_.activation_checkpointing;
  checkpointing_ = std::make_unique<ActivationCheckpointing>(
      ActivationCheckpointing::OptionsFor(ac, blocks, on_device(), tp_->size()), *tp_, *ops_,
      memory_.activations(), memory_.device_pinned(), [this](comm::Work& work) { WaitFor(work); });
  if (computes_ && ac.enabled) Log().info(checkpointing_->Describe(ac, on_device()));
}

void EngineImpl::InitParameters() {
  // Each rank initialises the elements it holds; the values depend on (seed, name, index)
  // only, so every layout starts from the single-process model.
  SetHeldParameters([this](const std::string& name, const Shape&, int64_t begin, int64_t count,
                           float* out) { InitialValues(name, begin, count, out); });
}

// All-gathers layer l's shard into `whole` (its padded size). With parameters on NVMe the
// shard is read into this rank's own chunk of `whole` and gathered in place.
// (Note [Offloaded shards beside compute], parallel/zero/param_gatherer.h).
comm::WorkPtr EngineImpl::LaunchGather(size_t l, const Buffer& whole, DType dtype) {
  const LayerState& st = *states_[l];
  optimizer_->StepLayer(l);  // Note [Deferred optimizer step]
  const Tensor out = whole.AsTensor(dtype, {st.layout.padded});
  const Tensor mine = out.Flat(st.layout.opt_begin, {st.layout.shard});
  Buffer staged;  // a shard read from NVMe, kept until the gather has read it
  const Tensor shard = held_->GatherSource(l, mine, staged);
  if (shard.data() == mine.data() || shard.device() == out.device()) {
    return dp_->AllGather(shard, out);
  }
  return zero::GatherHostShard(*dp_, *ops_, shard, mine, out);
}

double EngineImpl::TrainFlopsPerToken(int64_t seq_len) const {
  double f = 0.0;
  for (const auto& layer : layers_) f += layer->ForwardFlopsPerToken(seq_len);
  return 3.0 * f;
}

void EngineImpl::ZeroGrad() {
  for (size_t l = 0; l < states_.size(); ++l) {
    LayerState& st = *states_[l];
    if (!zero_.shard_gradients) memory_.Zero(st.grads);
    // A pending layer's gradients wait for its step (Note [Deferred optimizer step]).
    if (zero_.shard_gradients && !optimizer_->pending(l)) memory_.Zero(st.grad_shard);
  }
  optimizer_->GradientsZeroed();
}

double EngineImpl::MeanOverDp(double value) {
  if (dp_->size() == 1) return value;
  return static_cast<double>(AllReduceScalar(*dp_, static_cast<float>(value))) / dp_->size();
}

// Row (b, t) of this rank's micro-batch is row b' T + t' of the single process's, b' counting
// the samples of the data-parallel ranks before this one, t' the tokens of the cp pieces before
// this one (Note [Context parallelism]).
nn::LayerContext::Dropout EngineImpl::DropoutFor(const nn::MicroBatch& mb, int micro_batch) const {
  const int64_t t = mb.T(), whole = t * cp_size_, data_rank = dp_->rank() / cp_size_;
  nn::LayerContext::Dropout d{
      .key =
          kernels::DropoutKey(static_cast<uint64_t>(config_.training.seed), step_ + 1, micro_batch),
      .row_offset = data_rank * mb.B() * whole};
  if (cp_size_ == 1) return d;
  d.whole_run = whole;
  if (config_.context_parallel_algorithm == "ring") {  // chunks r and 2P - 1 - r of T / 2P
    d.run = t / 2;
    d.runs = 2;
    d.row_offset += cp_rank_ * d.run;
    d.second_run = (2 * cp_size_ - 1 - 2 * cp_rank_) * d.run;
  } else {
    d.run = t;
    d.row_offset += cp_rank_ * t;
  }
  return d;
}

}  // namespace ztrain
