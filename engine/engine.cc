#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/logging.h"
#include "engine/engine_state.h"
#include "estimate/shape_only.h"
#include "kernels/cuda_memory.h"
#include "nn/init.h"
#include "offload/io/io_engine.h"
#include "offload/optimizer_swapper.h"
#include "offload/param_swapper.h"
#include "offload/swap_dir.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"
#include "parallel/zero/flat_layout.h"

namespace ztrain {

namespace {

// Whether two spellings of a directory name the same one (compared as written when either
// does not exist; the SwapDir then says so).
bool SameDirectory(const std::string& a, const std::string& b) {
  std::error_code ec;
  const bool same = std::filesystem::equivalent(a, b, ec);
  return ec ? a == b : same;
}
}  // namespace

Engine::Engine(Config config, std::vector<std::unique_ptr<nn::Layer>> layers, ParallelGroups groups,
               InitialParameters initial)
    : Engine(std::move(config), std::move(layers), groups, initial, nullptr) {}

Engine::Engine(Config config, std::vector<std::unique_ptr<nn::Layer>> layers, ParallelGroups groups,
               ShapeOnly shape_only)
    : Engine(std::move(config), std::move(layers), groups, InitialParameters::kRandom,
             &shape_only) {}

Engine::Engine(Config config, std::vector<std::unique_ptr<nn::Layer>> layers, ParallelGroups groups,
               InitialParameters initial, const ShapeOnly* shape_only)
    : config_(std::move(config)),
      computes_(shape_only == nullptr),
      device_(shape_only ? shape_only->device : ResolveDevice(config_.device)),
      pinned_tracker_(device_.is_cpu() ? &device_tracker_ : &host_tracker_),
      host_(MakeAllocator(Memory::kHost)),
      pinned_(MakeAllocator(Memory::kPinnedHost)),
      device_alloc_(MakeAllocator(Memory::kDevice)),
      raw_device_(MakeAllocator(Memory::kRawDevice)),
      cuda_pinned_(MakeAllocator(Memory::kDevicePinned)),
      activations_(*raw_device_, &device_tracker_),
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
      scaler_(config_.precision.fp16
                  ? std::make_unique<optim::LossScaler>(LossScalerOptionsFrom(config_.precision))
                  : nullptr),
      ops_(MakeOps()),
      schedule_(optim::MakeLrSchedule(config_.scheduler, config_.optimizer.lr)),
      param_groups_(config_.optimizer) {
  ZTRAIN_CHECK(!layers.empty(), "the model has no layers");
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

// The engine's memory, each kind counted by its tracker: on the CPU backend host memory is
// the device's. A shape-only engine counts the same allocations of address space.
std::unique_ptr<Allocator> Engine::MakeAllocator(Memory memory) {
  const bool cpu = device_.is_cpu();
  MemoryTracker* host = cpu ? &device_tracker_ : &host_tracker_;
  if (memory == Memory::kDevicePinned && cpu) return nullptr;
  if (!computes_) {
    const bool on_device = memory == Memory::kDevice || memory == Memory::kRawDevice;
    MemoryTracker* tracker = memory == Memory::kDevice      ? &device_tracker_
                             : memory == Memory::kRawDevice ? nullptr
                             : memory == Memory::kHost      ? host
                                                            : &pinned_tracker_;
    return std::make_unique<detail::ShapeOnlyAllocator>(on_device ? device_ : Device::Cpu(),
                                                        tracker);
  }
  switch (memory) {
    case Memory::kDevice:
      return cpu ? std::make_unique<HostAllocator>(&device_tracker_)
                 : kernels::MakeCudaAllocator(device_.index, &device_tracker_);
    case Memory::kRawDevice:
      return cpu ? std::make_unique<HostAllocator>(nullptr)
                 : kernels::MakeCudaAllocator(device_.index, nullptr);
    case Memory::kHost:
      return std::make_unique<HostAllocator>(host);
    case Memory::kPinnedHost:
      return std::make_unique<PinnedHostAllocator>(&pinned_tracker_);
    case Memory::kDevicePinned:
      return kernels::MakeCudaPinnedAllocator(&pinned_tracker_);
  }
  return nullptr;
}

std::unique_ptr<kernels::Ops> Engine::MakeOps() const {
  if (!computes_) return std::make_unique<detail::ShapeOps>(device_);
  return device_.is_cpu() ? kernels::MakeCpuOps() : kernels::MakeCudaOps(device_.index);
}

Engine::~Engine() {
  // Ops in flight write into buffers about to be freed: gatherer_ and reducer_, destroyed
  // before the layers' buffers, wait for their own.
}

void Engine::BuildStorage() {
  const int64_t n_dp = dp_->size();
  for (size_t l = 0; l < layers_.size(); ++l) {
    auto state = std::make_unique<LayerState>();
    std::vector<nn::ParamSpec> specs = layers_[l]->Params();
    // A weight tied across pipeline stages sits at offset 0 in both stages' layers; the stage
    // holding the copy stores it under the owner's name (Note [Pipeline in the engine]).
    const StageTie* tie = nullptr;
    for (const StageTie& t : stage_ties_) {
      if (t.layer == l) tie = &t;
    }
    size_t first = specs.size();
    std::vector<bool> copies(specs.size(), false);
    for (size_t i = 0; i < specs.size(); ++i) {
      nn::ParamSpec& spec = specs[i];
      // A frozen weight tied to another stage's needs nothing kept equal: this stage holds
      // its own frozen copy (Note [Frozen parameters in the engine]).
      const bool frozen_copy =
          !spec.trainable && !spec.tied_to.empty() && slot_by_name_.count(spec.tied_to) == 0;
      if ((tie && tie->copy && spec.tied_to == tie->name) || frozen_copy) {
        spec.name = spec.tied_to;
        spec.tied_to.clear();
        copies[i] = true;
      }
      if (tie && spec.tied_to.empty() && spec.name == tie->name) first = i;
    }
    // Trainable parameters in elements of the flat buffers, frozen ones in elements of the
    // compute dtype in the frozen region (a quantized one's blob too: a multiple of 4 bytes).
    const auto es = static_cast<int64_t>(DTypeSize(act_dtype_));
    std::vector<zero::FlatParam> flat;
    for (const nn::ParamSpec& spec : specs) {
      ZTRAIN_CHECK(!spec.tied_to.empty() || slot_by_name_.count(spec.name) == 0, "parameter name '",
                   spec.name, "' is used twice; parameter names must be unique in the model");
      flat.push_back({spec.name, spec.trainable ? NumElements(spec.shape) : FrozenBytes(spec) / es,
                      spec.trainable, spec.packed, spec.tied_to.empty()});
    }
    zero::FlatLayoutOptions options;
    options.dp = static_cast<int>(n_dp);
    options.rank = dp_->rank();
    options.shard_optimizer = zero_.shard_optimizer;
    options.first = first;
    options.min_padded = min_padded_[l];
    options.frozen_element_bytes = es;
    const zero::FlatLayout layout = zero::LayOut(flat, options);
    const std::vector<int64_t>& offsets = layout.offsets;
    LayerState& st = *state;
    st.padded = layout.padded;
    st.shard = layout.shard;
    st.frozen_padded = layout.frozen_padded;
    st.frozen_shard = layout.frozen_shard;
    st.opt_begin = layout.opt_begin;
    st.opt_len = layout.opt_len;
    st.sharded = zero_.shard_parameters;
    // Where state lives (Note [State placement], offload/placement.h).
    const offload::Placement& at = placement_;
    if (at.params != Place::kNvme) {  // on NVMe the ParamSwapper holds the shard
      st.params =
          StateBuffer(at.params, st.sharded ? st.shard : st.padded, MemoryCategory::kParameters);
    }
    st.frozen = StateBuffer(at.frozen(), st.sharded ? st.frozen_shard : st.frozen_padded,
                            MemoryCategory::kParameters, DType::kU8);
    if (mixed() && !st.sharded) {
      st.lp = StateBuffer(Place::kDevice, st.padded, MemoryCategory::kParameters, act_dtype_);
    } else if (mixed() && on_device() && at.params_in_host()) {
      // Note [Offloaded shards beside compute]: the shard's compute-dtype copy, where it is.
      st.lp = StateBuffer(at.params, st.shard, MemoryCategory::kParameters, act_dtype_);
    }
    if (!zero_.shard_gradients) {
      st.grads = StateBuffer(Place::kDevice, st.padded, MemoryCategory::kGradients, grad_dtype_);
    }
    if (at.optimizer != Place::kNvme) {  // on NVMe the OptimizerSwapper holds m and v
      st.exp_avg = StateBuffer(at.optimizer, st.opt_len, MemoryCategory::kOptimizerState);
      st.exp_avg_sq = StateBuffer(at.optimizer, st.opt_len, MemoryCategory::kOptimizerState);
    }
    if (zero_.shard_optimizer || grad_dtype_ != DType::kF32) {
      st.grad_shard = StateBuffer(Place::kDevice, st.opt_len, MemoryCategory::kGradients);
    }
    if (on_device() && at.host_adam) {
      ZTRAIN_ASSERT(zero_.shard_optimizer);  // offload needs ZeRO 1-3 (config validation)
      st.grad_host = StateBuffer(Place::kPinned, st.opt_len, MemoryCategory::kGradients);
      if (at.host_master) {
        st.master = StateBuffer(Place::kPinned, st.opt_len, MemoryCategory::kOptimizerState);
      }
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      const nn::ParamSpec& spec = specs[i];
      size_t slot = slots_.size();
      if (offsets[i] < 0) {
        auto it = slot_by_name_.find(spec.tied_to);
        ZTRAIN_CHECK(it != slot_by_name_.end(), "layer ", layers_[l]->Name(), " ties '", spec.name,
                     "' to '", spec.tied_to, "', which no earlier layer declares");
        const Slot& owner = slots_[it->second];
        ZTRAIN_CHECK(owner.spec.shape == spec.shape, "tied parameter '", spec.name, "' has shape ",
                     ShapeToString(spec.shape), " but '", spec.tied_to, "' has ",
                     ShapeToString(owner.spec.shape));
        slot = it->second;
        states_[owner.layer]->tie_owner = true;
      } else {
        slot_by_name_[spec.name] = slot;
        st.owned.push_back(slot);
        slots_.push_back({spec, l, offsets[i], copies[i],
                          param_groups_.Assign(spec.name, spec.shape.size(), spec.trainable)});
      }
      st.bound.push_back(slot);
      const size_t unit = slots_[slot].layer;
      if (std::find(st.units.begin(), st.units.end(), unit) == st.units.end()) {
        st.units.push_back(unit);
      }
    }
    states_.push_back(std::move(state));
    BindLayer(l);
  }
}

// Gives layer l views of its parameters and of the full gradient buffers they accumulate
// into (its own, or an earlier layer's for tied parameters). At stages 2 and 3 it runs again
// before each use, once the buffers exist; views of absent buffers stay undefined.
void Engine::BindLayer(size_t l) {
  const Buffer none;  // stage 3 before the gatherer exists (construction)
  std::vector<Tensor> params, grads;
  for (size_t slot : states_[l]->bound) {
    const Slot& s = slots_[slot];
    const LayerState& owner = *states_[s.layer];
    if (s.frozen()) {  // no gradient (Note [Frozen parameters in the engine])
      params.push_back(FrozenView(!owner.sharded ? owner.frozen
                                  : gatherer_    ? gatherer_->FrozenWhole(s.layer)
                                                 : none,
                                  s));
      grads.emplace_back();
      continue;
    }
    // Layers compute with the compute-dtype copy under mixed precision (gathered at stage 3).
    const Buffer& whole = !owner.sharded ? (mixed() ? owner.lp : owner.params)
                          : gatherer_    ? gatherer_->Whole(s.layer)
                                         : none;
    params.push_back(whole.data() == nullptr
                         ? Tensor()
                         : whole.AsTensor(act_dtype_, {owner.padded}).Flat(s.offset, s.spec.shape));
    grads.push_back(
        owner.grads.data() == nullptr
            ? Tensor()
            : owner.grads.AsTensor(grad_dtype_, {owner.padded}).Flat(s.offset, s.spec.shape));
  }
  layers_[l]->Bind(std::move(params), std::move(grads));
}

void Engine::AllocateFullGradients(size_t l) {
  LayerState& st = *states_[l];
  if (st.grads.data() != nullptr) return;
  st.grads = Buffer(activations_, grad_dtype_, {st.padded}, MemoryCategory::kGradients);
  ZeroFill(st.grads);
}

void Engine::WaitFor(comm::Work& work) {
  const auto start = std::chrono::steady_clock::now();
  work.Wait();
  comm_wait_seconds_ += SecondsBetween(start, std::chrono::steady_clock::now());
}

void Engine::SetUpOffload() {
  const OffloadParamConfig& op = config_.zero.offload_param;
  const OffloadOptimizerConfig& oo = config_.zero.offload_optimizer;
  const bool param_nvme = placement_.params == Place::kNvme;
  const bool opt_nvme = placement_.optimizer == Place::kNvme;
  const bool param_host = placement_.params_in_host();
  const bool opt_host = oo.device == "cpu";
  if ((param_host || opt_host) && computes_) {
    // Pinned state so far: the CPU backend's mlock'ed allocations, or CUDA's pinned memory.
    const auto* locked = dynamic_cast<const PinnedHostAllocator*>(pinned_.get());
    const int64_t unpinned = device_.is_cpu() && locked ? locked->unpinned_bytes() : 0;
    const int64_t pinned = pinned_tracker_.TotalCurrent() - unpinned;
    Log().info("offload: {}{}{} in host memory{}", opt_host ? "optimizer state" : "",
               param_host && opt_host ? " and " : "", param_host ? "parameter shards" : "",
               pinned + unpinned == 0
                   ? " (pin_memory off)"
                   : fmt::format(", {} pinned{}", FormatBytes(pinned),
                                 unpinned == 0 ? ""
                                               : fmt::format(", {} not (RLIMIT_MEMLOCK too small: "
                                                             "raise `ulimit -l`)",
                                                             FormatBytes(unpinned))));
  }
  if (!param_nvme && !opt_nvme) return;
  std::vector<int64_t> shards, opt_ranges;
  for (const auto& st : states_) {
    shards.push_back(st->shard);
    opt_ranges.push_back(st->opt_len);
  }
  const int64_t param_bytes =
      param_nvme ? offload::ParamSwapper::FileBytes(shards, op.max_in_cpu) : 0;
  const int64_t opt_bytes =
      opt_nvme ? offload::OptimizerSwapper::FileBytes(opt_ranges, config_.zero.sub_group_size) : 0;
  swap_file_bytes_ = param_bytes + opt_bytes;
  // A shape-only engine makes its swappers' buffers, and no directory, file or I/O engine.
  std::string param_file, opt_file;
  if (computes_) {
    io_ = offload::IoEngine::Make(offload::IoOptionsFrom(config_.aio));
    MakeSwapDirs(param_bytes, opt_bytes, &param_file, &opt_file);
  }
  if (param_nvme) {
    const offload::ParamSwapOptions options{.buffer_count = static_cast<int>(op.buffer_count),
                                            .buffer_elements = op.buffer_size,
                                            .max_in_cpu = op.max_in_cpu};
    param_swap_ = std::make_unique<offload::ParamSwapper>(io_.get(), param_file, shards, options,
                                                          *host_, *pinned_);
  }
  if (opt_nvme) {
    const offload::OptimizerSwapOptions options{.tile_elements = config_.zero.sub_group_size,
                                                .pipeline_read = oo.pipeline_read,
                                                .pipeline_write = oo.pipeline_write,
                                                .buffers = static_cast<int>(oo.buffer_count)};
    opt_swap_ = std::make_unique<offload::OptimizerSwapper>(io_.get(), opt_file, opt_ranges,
                                                            options, *pinned_);
  }
  // Note [Deferred optimizer step]: so far on the CPU backend.
  defer_steps_ = param_swap_ && !on_device();
  if (!computes_) return;
  Log().info("offload: {}{}{}; I/O through {}{}",
             param_nvme ? fmt::format("parameter shards on NVMe ({} swapped, {} kept in memory)",
                                      FormatBytes(param_bytes),
                                      FormatBytes(4 * param_swap_->resident_elements()))
                        : "",
             param_nvme && opt_nvme ? ", " : "",
             opt_nvme ? fmt::format("optimizer state on NVMe ({} in tiles of {} elements, {} "
                                    "buffers)",
                                    FormatBytes(opt_bytes), opt_swap_->tile_elements(),
                                    opt_swap_->buffers())
                      : "",
             io_->backend(),
             defer_steps_ ? "; each layer's optimizer step runs as the next forward reads it" : "");
}

// The rank's swap directories, checked for the space their files need, and the files' paths
// (empty where nothing is swapped).
void Engine::MakeSwapDirs(int64_t param_bytes, int64_t opt_bytes, std::string* param_file,
                          std::string* opt_file) {
  const OffloadParamConfig& op = config_.zero.offload_param;
  const OffloadOptimizerConfig& oo = config_.zero.offload_optimizer;
  const bool param_nvme = placement_.params == Place::kNvme;
  const bool opt_nvme = placement_.optimizer == Place::kNvme;
  // One swap directory per distinct nvme_path ("/nvme" and "/nvme/" are one: a second
  // SwapDir of the same directory would find it locked), checked for the bytes all its files
  // need.
  const bool shared = param_nvme && opt_nvme && SameDirectory(op.nvme_path, oo.nvme_path);
  // The rank's place in the dp x pp x tp grid (its world rank, ProcessGrid's order) names its
  // swap directory, so no two ranks of a job share one; the grid's size tells directories of
  // this run's ranks from those an earlier run with more ranks left (Note [Stale swap
  // directories]).
  const int grid_rank = (pp_->rank() * dp_->size() + dp_->rank()) * tp_->size() + tp_->rank();
  const int grid_size = pp_->size() * dp_->size() * tp_->size();
  auto make_dir = [&](const std::string& path, int64_t bytes, const std::string& what) {
    swap_dirs_.push_back(std::make_unique<offload::SwapDir>(
        path, config_.training.job_name, grid_rank, grid_size, bytes, what,
        offload::FreeBytesFunction{}, config_.ranks_on_node));
    return swap_dirs_.back().get();
  };
  offload::SwapDir* param_dir = nullptr;
  offload::SwapDir* opt_dir = nullptr;
  if (shared) {
    param_dir = opt_dir = make_dir(op.nvme_path, param_bytes + opt_bytes, "offload");
  } else {
    if (param_nvme) param_dir = make_dir(op.nvme_path, param_bytes, "offload_param");
    if (opt_nvme) opt_dir = make_dir(oo.nvme_path, opt_bytes, "offload_optimizer");
  }
  if (param_dir) *param_file = param_dir->File("params.swp");
  if (opt_dir) *opt_file = opt_dir->File("optimizer.swp");
}

void Engine::InitParameters() {
  // Each rank initialises the elements it holds; the values depend on (seed, name, index)
  // only, so every layout starts from the single-process model.
  SetHeldParameters([this](const std::string& name, const Shape&, int64_t begin, int64_t count,
                           float* out) { InitialValues(name, begin, count, out); });
}

namespace {

// A gather of one rank (dp of 1) whose shard comes from the host beside the ops (Note
// [Offloaded shards beside compute]): waiting for it orders the ops issued after the wait
// after the copy, on the device. Done once waited for; a gather dropped unwaited (after an
// error) still orders the freeing of its buffer after the copy.
class CopyBesideWork final : public comm::Work {
 public:
  CopyBesideWork(kernels::Ops& ops, kernels::CopyTicket ticket) : ops_(ops), ticket_(ticket) {}
  ~CopyBesideWork() override {
    try {
      Wait();
    } catch (...) {  // a broken device; nothing left to order
    }
  }
  void Wait() override {
    if (waited_) return;
    waited_ = true;
    ops_.WaitCopy(ticket_);
  }
  bool Done() override { return waited_; }

 private:
  kernels::Ops& ops_;
  kernels::CopyTicket ticket_;
  bool waited_ = false;
};

}  // namespace

// All-gathers layer l's shard into `whole` (its padded size). With parameters on NVMe the
// shard is read into this rank's own chunk of `whole` and gathered in place.
//
// Note [Offloaded shards beside compute]: with offload_param on a GPU the shard is host
// memory: the fp32 master, or under mixed precision its compute-dtype copy `lp`, refreshed
// with the master, so the gather moves 2 bytes a parameter over PCIe (DeepSpeed keeps the
// same 16-bit copy on the host). The copy to this rank's chunk of `whole` runs beside the
// ops, so the copy for a layer the plan prefetches runs while the layer before it computes.
// Across ranks the all-gather takes the host shard itself and copies it on the group's
// stream before gathering (communicator.h), where NCCL orders it after the ops issued before
// it; the gatherer waits for the whole gather as for any other. On one rank there is nothing
// to gather: the copy goes beside the ops (Ops::CopyBeside), the gather's Work is its ticket,
// and waiting for it makes the layer's ops wait on the device, not the host. A frozen base
// offloaded to the host (LoRA) is gathered the same way (LaunchFrozenGather).
comm::WorkPtr Engine::LaunchGather(size_t l, const Buffer& whole, DType dtype) {
  LayerState& st = *states_[l];
  const Tensor out = whole.AsTensor(dtype, {st.padded});
  if (!param_swap_ && st.params.device() == whole.device() && dtype == DType::kF32) {
    return dp_->AllGather(st.Flat(st.params, st.shard), out);
  }
  const Tensor mine = out.Flat(st.opt_begin, {st.shard});
  if (!param_swap_ && st.params.device() == whole.device()) {
    // The compute-dtype copy of the shard, converted into this rank's chunk.
    ops_->Copy(st.Flat(st.params, st.shard), mine);
    return dp_->AllGather(mine, out);
  }
  optimizer_->StepLayer(l);  // Note [Deferred optimizer step]
  if (param_swap_ && whole.device().is_cpu() && dtype == DType::kF32) {
    const ScopeTimer timer(swap_wait_seconds_);
    param_swap_->CopyOut(l, mine.data<float>());
    return dp_->AllGather(mine, out);
  }
  // The shard on the host in the gather's dtype: the master or its `lp` copy, or from NVMe
  // (staged in pageable memory, which may go once the copy is issued).
  Buffer staged;
  Tensor shard;
  if (!param_swap_) {
    shard = dtype == DType::kF32 || st.lp.data() == nullptr
                ? st.Flat(st.params, st.shard)
                : st.lp.AsTensor(dtype, {st.shard});
  } else {
    staged = Buffer(*host_, DType::kF32, {st.shard}, MemoryCategory::kWorkspace);
    const ScopeTimer timer(swap_wait_seconds_);
    param_swap_->CopyOut(l, staged.data<float>());
    shard = st.Flat(staged, st.shard);
  }
  if (shard.dtype() != dtype) {  // converted by the ops (NVMe under mixed precision)
    ops_->Copy(shard, mine);
    ops_->Synchronize();  // before `staged` goes
    return dp_->AllGather(mine, out);
  }
  return GatherHostShard(shard, mine, out);
}

comm::WorkPtr Engine::GatherHostShard(const Tensor& shard, const Tensor& mine, const Tensor& out) {
  if (dp_->size() > 1) return dp_->AllGather(shard, out);  // copied on the group's stream
  return std::make_shared<CopyBesideWork>(*ops_, ops_->CopyBeside(shard, mine));
}

double Engine::TrainFlopsPerToken(int64_t seq_len) const {
  double f = 0.0;
  for (const auto& layer : layers_) f += layer->ForwardFlopsPerToken(seq_len);
  return 3.0 * f;
}

void Engine::ZeroGrad() {
  for (size_t l = 0; l < states_.size(); ++l) {
    LayerState& st = *states_[l];
    if (!zero_.shard_gradients) ZeroFill(st.grads);
    // A pending layer's gradients wait for its step (Note [Deferred optimizer step]).
    if (zero_.shard_gradients && !optimizer_->pending(l)) ZeroFill(st.grad_shard);
  }
  optimizer_->GradientsZeroed();
}

double Engine::MeanOverDp(double value) {
  if (dp_->size() == 1) return value;
  return static_cast<double>(AllReduceScalar(*dp_, static_cast<float>(value))) / dp_->size();
}

nn::LayerContext::Dropout Engine::DropoutFor(const nn::MicroBatch& mb, int micro_batch) const {
  return {kernels::DropoutKey(static_cast<uint64_t>(config_.training.seed), step_ + 1, micro_batch),
          static_cast<int64_t>(dp_->rank()) * mb.B() * mb.T()};
}

}  // namespace ztrain
