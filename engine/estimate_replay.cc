// The replay of one rank's allocations for a memory estimate (Note [Memory estimate],
// estimate_replay.h): the engine's construction and one train step, allocation by
// allocation, in the engine's order. Each function names the engine code it follows.
#include "engine/estimate_replay.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/memory_tracker.h"
#include "offload/io/io_options.h"
#include "offload/optimizer_swapper.h"
#include "offload/param_swapper.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/zero/gather_plan.h"

namespace ztrain::detail {
namespace {

constexpr int64_t kF32 = 4;
constexpr int64_t kI32 = 4;

enum class Where { kDevice, kHost, kPinned };

// Counts allocations as the engine's MemoryTracker does (bytes in use, per category, peaks
// per category and of the total), and again by where they live. On the CPU backend the
// device is host memory: everything counts as device.
class Ledger {
 public:
  using Id = int64_t;  // 0: no allocation
  explicit Ledger(bool gpu) : gpu_(gpu) {}

  Id Alloc(MemoryCategory c, int64_t bytes, Where where) {
    if (bytes <= 0) return 0;  // the allocators count nothing for zero bytes
    const Id id = ++next_;
    const Block& b = live_.emplace(id, Block{c, bytes, where}).first->second;
    for (MemoryTracker* t : Trackers(b)) t->Allocated(c, bytes);
    return id;
  }
  void Free(Id& id) {
    if (id == 0) return;
    auto it = live_.find(id);
    ZTRAIN_ASSERT(it != live_.end(), "estimate: freeing an unknown block");
    for (MemoryTracker* t : Trackers(it->second)) t->Freed(it->second.category, it->second.bytes);
    live_.erase(it);
    id = 0;
  }
  void Free(std::vector<Id>& ids) {
    for (Id& id : ids) Free(id);
    ids.clear();
  }
  void Fill(MemoryEstimate& e) const {
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      const auto cat = static_cast<MemoryCategory>(c);
      e.peak[c] = all_.Peak(cat);
      e.device_peak[c] = device_.Peak(cat);
      e.host_peak[c] = host_.Peak(cat);
    }
    e.total_peak = all_.TotalPeak();
    e.device_total_peak = device_.TotalPeak();
    e.host_total_peak = host_.TotalPeak();
    e.pinned_host_peak = pinned_.TotalPeak();
  }

 private:
  struct Block {
    MemoryCategory category;
    int64_t bytes;
    Where where;
  };
  std::vector<MemoryTracker*> Trackers(const Block& b) {
    std::vector<MemoryTracker*> t = {&all_, gpu_ && b.where != Where::kDevice ? &host_ : &device_};
    if (b.where == Where::kPinned) t.push_back(&pinned_);
    return t;
  }
  bool gpu_;
  Id next_ = 0;
  std::unordered_map<Id, Block> live_;
  MemoryTracker all_, device_, host_, pinned_;
};

class RankReplay {
 public:
  RankReplay(const EstimateInput& in, const StageLayout& layout);
  MemoryEstimate Run();

 private:
  using Id = Ledger::Id;
  // One micro-batch in flight (Engine::MicroBatchRun).
  struct Flight {
    std::vector<Id> outputs;
    std::vector<Id> kept;  // a checkpointed block's input in parts or in host memory
    // Per layer: what its Forward and Backward allocated and have not freed (Note [Memory
    // estimate]), by the recorded allocation id, until the layer's context is released.
    std::vector<std::map<int, Id>> live;
    Id received = 0;
  };
  size_t n() const { return layers_.size(); }
  int64_t opt_len(const LayerLayout& l) const { return stage_ >= 1 ? l.shard : l.padded; }
  bool checkpointed(size_t i) const {
    const LayerLayout& l = layers_[i];
    return l.kind == LayerLayout::Kind::kBlock && in_.checkpointed[static_cast<size_t>(l.block)];
  }
  Where staging() const { return in_.gpu ? Where::kHost : Where::kDevice; }
  void Keep(MemoryCategory c, int64_t bytes, Where where) { ledger_.Alloc(c, bytes, where); }
  void Transient(MemoryCategory c, int64_t bytes, Where where) {
    Id id = ledger_.Alloc(c, bytes, where);
    ledger_.Free(id);
  }
  // Plays a layer's recorded allocations and frees; what stays allocated is in `live`.
  void Play(const std::vector<AllocEvent>& events, std::map<int, Id>& live) {
    for (const AllocEvent& e : events) {
      if (!e.free) {
        live[e.id] = ledger_.Alloc(e.category, e.bytes, Where::kDevice);
        continue;
      }
      auto it = live.find(e.id);
      ZTRAIN_ASSERT(it != live.end(), "a layer freed allocation ", e.id, " twice");
      ledger_.Free(it->second);
      live.erase(it);
    }
  }
  // LayerContext::Release.
  void Release(std::map<int, Id>& live) {
    for (auto& [event, id] : live) ledger_.Free(id);
    live.clear();
  }

  void BuildStorage();
  void SetUpOffload();
  void InitParameters();
  void TrainStep();
  void TrainStepPipelined();
  void Forward(Flight& run);
  void KeepOnlyInput(size_t i, Flight& run);
  void RestoreInput(size_t i, Flight& run);
  int64_t PartBytes(int64_t bytes) const;
  Id Backward(Flight& run, Id dout, bool reduce);
  void Scalars();
  void OptimizerStep();
  void GatherParameters();
  void SumStageTiedGradients();
  void StartGatherPlan(const std::vector<bool>& phases);
  void GatherForUse(size_t l);
  void ReleaseAfterUse();
  void AllocateFullGradients(size_t l);
  void OnGradientsReady(size_t l);
  void LaunchBucket();
  void FinishReductions();

  const EstimateInput& in_;
  const Config& config_;
  const ZeroConfig& z_;
  const std::vector<LayerLayout>& layers_;
  Ledger ledger_;
  int stage_;
  bool overlap_, host_adam_, param_nvme_, opt_nvme_, param_offload_, grads16_;
  Where param_place_, opt_place_;
  int64_t act_bytes_, grad_bytes_;
  int64_t nvme_bytes_ = 0;
  std::vector<Id> gathered_, grads_, grads32_, grad_recv_;
  std::vector<size_t> pending_, launched_;
  int64_t pending_elements_ = 0;
  zero::GatherPlan plan_;
  size_t position_ = 0;
};

RankReplay::RankReplay(const EstimateInput& in, const StageLayout& layout)
    : in_(in),
      config_(*in.config),
      z_(in.config->zero),
      layers_(layout.layers),
      ledger_(in.gpu),
      stage_(in.config->zero.stage),
      act_bytes_(static_cast<int64_t>(DTypeSize(in.compute))),
      grad_bytes_(static_cast<int64_t>(DTypeSize(in.grad))),
      gathered_(layout.layers.size(), 0),
      grads_(layout.layers.size(), 0),
      grads32_(layout.layers.size(), 0),
      grad_recv_(layout.layers.size(), 0) {
  const OffloadParamConfig& op = z_.offload_param;
  const OffloadOptimizerConfig& oo = z_.offload_optimizer;
  // As the Engine's constructor and BuildStorage decide.
  overlap_ = stage_ == 0 || z_.overlap_comm;
  host_adam_ = !in.gpu || oo.device != "none" || (stage_ == 3 && op.device != "none");
  param_nvme_ = stage_ == 3 && op.device == "nvme";
  opt_nvme_ = oo.device == "nvme";
  param_offload_ = stage_ == 3 && op.device != "none";
  grads16_ = in.grad != DType::kF32;
  param_place_ = op.device == "cpu" && op.pin_memory ? Where::kPinned
                 : param_offload_                    ? Where::kHost
                                                     : Where::kDevice;
  opt_place_ = oo.device == "cpu" && oo.pin_memory ? Where::kPinned
               : host_adam_                        ? Where::kHost
                                                   : Where::kDevice;
}

MemoryEstimate RankReplay::Run() {
  BuildStorage();
  SetUpOffload();
  InitParameters();
  TrainStep();  // every step allocates the same: one is the steady state
  MemoryEstimate e;
  ledger_.Fill(e);
  e.nvme_bytes = nvme_bytes_;
  return e;
}

// Engine::BuildStorage, layer by layer. Mixed precision (Note [Mixed precision in the
// engine]): a compute-dtype copy of each whole layer at stages 0-2, gradients in the
// accumulation dtype, and with 16-bit gradients an fp32 `grad_shard` at stage 0 too.
void RankReplay::BuildStorage() {
  const bool mixed = in_.compute != DType::kF32;
  for (const LayerLayout& l : layers_) {
    if (!param_nvme_)
      Keep(MemoryCategory::kParameters, (stage_ == 3 ? l.shard : l.padded) * kF32, param_place_);
    if (mixed && stage_ <= 2)
      Keep(MemoryCategory::kParameters, l.padded * act_bytes_, Where::kDevice);
    if (stage_ <= 1) Keep(MemoryCategory::kGradients, l.padded * grad_bytes_, Where::kDevice);
    if (!opt_nvme_) {
      Keep(MemoryCategory::kOptimizerState, opt_len(l) * kF32, opt_place_);  // exp_avg
      Keep(MemoryCategory::kOptimizerState, opt_len(l) * kF32, opt_place_);  // exp_avg_sq
    }
    if (stage_ >= 1 || grads16_) {
      Keep(MemoryCategory::kGradients, (stage_ >= 1 ? l.shard : l.padded) * kF32, Where::kDevice);
    }
    if (in_.gpu && host_adam_) {  // Note [Devices in the engine]
      Keep(MemoryCategory::kGradients, opt_len(l) * kF32, Where::kPinned);  // grad_host
      if (!param_offload_) Keep(MemoryCategory::kOptimizerState, opt_len(l) * kF32, Where::kPinned);
    }
  }
}

// Engine::SetUpOffload with the swappers' constructors (offload/param_swapper.cc,
// offload/optimizer_swapper.cc).
void RankReplay::SetUpOffload() {
  const OffloadParamConfig& op = z_.offload_param;
  std::vector<int64_t> shards;
  int64_t opt_elements = 0;
  for (const LayerLayout& l : layers_) {
    shards.push_back(l.shard);
    opt_elements += opt_len(l);
  }
  if (param_nvme_) {
    nvme_bytes_ += offload::ParamSwapper::FileBytes(shards, op.max_in_cpu);
    int64_t resident = 0, largest = 0;
    for (size_t l = 0; l < shards.size(); ++l) {
      if (resident + shards[l] <= op.max_in_cpu) {  // kept in memory, in model order
        resident += shards[l];
        Keep(MemoryCategory::kParameters, shards[l] * kF32, Where::kHost);
        continue;
      }
      ZTRAIN_CHECK_T(ConfigError, shards[l] <= op.buffer_size,
                     "zero_optimization.offload_param."
                     "buffer_size is ",
                     op.buffer_size, " elements but layer ", l,
                     "'s parameter shard on this rank has ", shards[l],
                     "; set buffer_size to at least ", shards[l]);
      largest = std::max(largest, shards[l]);
    }
    for (int64_t i = 0; largest > 0 && i < op.buffer_count; ++i) {
      Keep(MemoryCategory::kSwapBuffers, offload::AlignUp(largest * kF32), Where::kPinned);
    }
  }
  if (opt_nvme_) {
    const OffloadOptimizerConfig& oo = z_.offload_optimizer;
    nvme_bytes_ += offload::OptimizerSwapper::FileBytes(opt_elements, z_.sub_group_size);
    const int64_t tile = std::max<int64_t>(1, std::min(z_.sub_group_size, opt_elements));
    const int buffers = 1 + (oo.pipeline_read ? 1 : 0) + (oo.pipeline_write ? 1 : 0);
    for (int i = 0; i < buffers; ++i) {
      Keep(MemoryCategory::kSwapBuffers, 2 * offload::AlignUp(tile * kF32), Where::kPinned);
    }
  }
}

// Engine::InitParameters: a layer's values are made in a host copy when its parameters live
// on NVMe or on the GPU, one layer at a time.
void RankReplay::InitParameters() {
  if (!param_nvme_ && !(in_.gpu && param_place_ == Where::kDevice)) return;
  for (const LayerLayout& l : layers_) {
    Transient(MemoryCategory::kParameters, (stage_ == 3 ? l.shard : l.padded) * kF32, staging());
  }
}

// Engine::TrainStep (and StageBatches, ForwardBackwardImpl).
void RankReplay::TrainStep() {
  const int64_t tokens = in_.micro_batch * in_.seq_len;
  std::vector<Id> batches;  // tokens and targets copied to the GPU, for the whole step
  for (int64_t m = 0; in_.gpu && m < in_.grad_accum; ++m) {
    batches.push_back(ledger_.Alloc(MemoryCategory::kActivations, tokens * kI32, Where::kDevice));
    batches.push_back(ledger_.Alloc(MemoryCategory::kActivations, tokens * kI32, Where::kDevice));
  }
  if (in_.pp > 1) {
    TrainStepPipelined();
  } else {
    if (stage_ == 3) {
      std::vector<bool> phases;
      for (int64_t m = 0; m < in_.grad_accum; ++m) phases.insert(phases.end(), {false, true});
      StartGatherPlan(phases);
    }
    for (int64_t m = 0; m < in_.grad_accum; ++m) {
      Flight run;
      Forward(run);
      const Id dout = ledger_.Alloc(MemoryCategory::kActivations, tokens * kF32, Where::kDevice);
      Id din = Backward(run, dout, m + 1 == in_.grad_accum);
      ledger_.Free(din);
    }
    Scalars();
    OptimizerStep();
  }
  ledger_.Free(batches);
}

// When each send of stage `stage`'s list finishes, on pipeline::Simulate's clock (forward 1,
// backward 2): when the neighbour starts the matching receive, or when it was sent if later.
// -1 for other instructions.
std::vector<double> SendsDone(pipeline::ScheduleKind kind, int stages, int stage, int m) {
  using pipeline::OpType;
  const pipeline::Timeline time = pipeline::Simulate(kind, stages, m);
  const std::vector<pipeline::Instruction> list = pipeline::MakeSchedule(kind, stages, stage, m);
  std::vector<double> done(list.size(), -1.0);
  for (size_t i = 0; i < list.size(); ++i) {
    const bool forward = list[i].op == OpType::kSendActivation;
    if (!forward && list[i].op != OpType::kSendGrad) continue;
    const int peer = forward ? stage + 1 : stage - 1;
    const std::vector<pipeline::Instruction> theirs = pipeline::MakeSchedule(kind, stages, peer, m);
    const pipeline::Instruction recv{forward ? OpType::kRecvActivation : OpType::kRecvGrad,
                                     list[i].micro_batch};
    const size_t j =
        static_cast<size_t>(std::find(theirs.begin(), theirs.end(), recv) - theirs.begin());
    ZTRAIN_ASSERT(j < theirs.size(), "estimate: a send without its receive");
    done[i] =
        std::max(time.end[static_cast<size_t>(stage)][i], time.start[static_cast<size_t>(peer)][j]);
  }
  return done;
}

// Engine::TrainStepPipelined: the stage's instruction list. The engine frees a send's buffer
// at the start of the first instruction that finds it finished; the neighbours' progress
// comes from pipeline::Simulate (SendsDone), and a send finishing as an instruction starts
// still counts at it.
void RankReplay::TrainStepPipelined() {
  const int m = static_cast<int>(in_.grad_accum);
  const pipeline::ScheduleKind kind = pipeline::ParseScheduleKind(config_.pipeline_schedule);
  const std::vector<pipeline::Instruction> list =
      pipeline::MakeSchedule(kind, in_.pp, in_.pp_stage, m);
  const std::vector<double> sends_done = SendsDone(kind, in_.pp, in_.pp_stage, m);
  const std::vector<double> starts =
      pipeline::Simulate(kind, in_.pp, m).start[static_cast<size_t>(in_.pp_stage)];
  size_t last_backward = 0;
  std::vector<bool> phases;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].op == pipeline::OpType::kForward) phases.push_back(false);
    if (list[i].op == pipeline::OpType::kBackward) {
      phases.push_back(true);
      last_backward = i;
    }
  }
  if (stage_ == 3) StartGatherPlan(phases);
  const bool last_stage = in_.pp_stage == in_.pp - 1;
  const int64_t tokens = in_.micro_batch * in_.seq_len;
  std::vector<Flight> runs(static_cast<size_t>(m));
  std::vector<Id> received_grads(static_cast<size_t>(m), 0), din(static_cast<size_t>(m), 0);
  std::vector<std::pair<Id, double>> sends;  // in flight, with when they finish
  auto free_sends = [&](double now) {
    for (auto& [id, done] : sends) {
      if (done < now) ledger_.Free(id);
    }
    std::erase_if(sends, [](const auto& s) { return s.first == 0; });
  };
  for (size_t i = 0; i < list.size(); ++i) {
    free_sends(starts[i]);
    const auto mb = static_cast<size_t>(std::max(list[i].micro_batch, 0));
    Flight& run = runs[mb];
    switch (list[i].op) {
      case pipeline::OpType::kLoadMicroBatch:
        break;
      case pipeline::OpType::kRecvActivation:
        run.received = ledger_.Alloc(MemoryCategory::kActivations,
                                     tokens * config_.model.n_embd * act_bytes_, Where::kDevice);
        break;
      case pipeline::OpType::kForward:
        Forward(run);
        break;
      case pipeline::OpType::kSendActivation:
        sends.emplace_back(std::exchange(run.outputs.back(), 0), sends_done[i]);
        break;
      case pipeline::OpType::kRecvGrad:
        received_grads[mb] =
            ledger_.Alloc(MemoryCategory::kActivations, layers_.back().acts.output, Where::kDevice);
        break;
      case pipeline::OpType::kBackward: {
        const Id dout =
            last_stage ? ledger_.Alloc(MemoryCategory::kActivations, tokens * kF32, Where::kDevice)
                       : std::exchange(received_grads[mb], 0);
        din[mb] = Backward(run, dout, i == last_backward);
        ledger_.Free(run.received);
        break;
      }
      case pipeline::OpType::kSendGrad:
        sends.emplace_back(std::exchange(din[mb], 0), sends_done[i]);
        break;
      case pipeline::OpType::kReduceGrads:  // waits for every send
        free_sends(std::numeric_limits<double>::infinity());
        SumStageTiedGradients();
        break;
      case pipeline::OpType::kOptimizerStep:
        Scalars();
        OptimizerStep();
        break;
    }
  }
  free_sends(std::numeric_limits<double>::infinity());
  ledger_.Free(din);
}

// Engine::RunForward. A checkpointed block (Note [Activation checkpointing in the engine]) keeps
// only its input — the previous layer's output, which the engine keeps anyway — so what its
// Forward saved is freed at once and recomputed in Backward; with partition_activations or
// cpu_checkpointing the input itself gives way to its 1/tp part or a pinned host copy
// (Engine::KeepOnlyInput).
void RankReplay::Forward(Flight& run) {
  run.outputs.assign(n(), 0);
  run.kept.assign(n(), 0);
  run.live.assign(n(), {});
  for (size_t i = 0; i < n(); ++i) {
    run.outputs[i] =
        ledger_.Alloc(MemoryCategory::kActivations, layers_[i].acts.output, Where::kDevice);
    if (stage_ == 3) GatherForUse(i);
    Play(layers_[i].acts.forward, run.live[i]);
    if (stage_ == 3) ReleaseAfterUse();
    if (checkpointed(i)) KeepOnlyInput(i, run);
  }
}

void RankReplay::KeepOnlyInput(size_t i, Flight& run) {
  Release(run.live[i]);
  if (i == 0 || (!in_.partition_checkpoints && !in_.offload_checkpoints)) return;
  const int64_t bytes = layers_[i - 1].acts.output;
  run.kept[i - 1] =
      in_.partition_checkpoints
          ? ledger_.Alloc(MemoryCategory::kActivations, PartBytes(bytes), Where::kDevice)
          : ledger_.Alloc(MemoryCategory::kActivations, bytes, Where::kPinned);
  ledger_.Free(run.outputs[i - 1]);
}

// Engine::RestoreInput: the whole input again (all-gathered parts are padded to tp equal
// ones), before layer i's backward.
void RankReplay::RestoreInput(size_t i, Flight& run) {
  const int64_t bytes = layers_[i - 1].acts.output;
  run.outputs[i - 1] =
      ledger_.Alloc(MemoryCategory::kActivations,
                    in_.partition_checkpoints ? PartBytes(bytes) * in_.tp : bytes, Where::kDevice);
  ledger_.Free(run.kept[i - 1]);
}

// One tp rank's part of a kept input of `bytes`: ceil(elements / tp) elements.
int64_t RankReplay::PartBytes(int64_t bytes) const {
  const auto elem = static_cast<int64_t>(DTypeSize(in_.compute));
  return (bytes / elem + in_.tp - 1) / in_.tp * elem;
}

// Engine::RunBackward: returns the gradient of the stage's input (none on the first stage).
RankReplay::Id RankReplay::Backward(Flight& run, Id dout, bool reduce) {
  reduce = reduce || stage_ >= 2;
  if (stage_ >= 2) {
    for (size_t l = 0; l < n(); ++l) {
      if (layers_[l].tie_owner) AllocateFullGradients(l);
    }
  }
  for (size_t i = n(); i-- > 0;) {
    if (i > 0 && run.kept[i - 1] != 0) RestoreInput(i, run);
    if (stage_ == 3) GatherForUse(i);
    if (stage_ >= 2) AllocateFullGradients(i);
    Id din = i > 0 || in_.pp_stage > 0
                 ? ledger_.Alloc(MemoryCategory::kActivations, layers_[i].acts.input_grad, Where::kDevice)
                 : 0;
    if (checkpointed(i)) {  // Engine::Recompute: Forward again into a throwaway output
      Id out =
          ledger_.Alloc(MemoryCategory::kActivations, layers_[i].acts.output, Where::kDevice);
      Play(layers_[i].acts.forward, run.live[i]);
      ledger_.Free(out);
    }
    Play(layers_[i].acts.backward, run.live[i]);
    if (stage_ == 3) ReleaseAfterUse();
    if (reduce) OnGradientsReady(i);
    Release(run.live[i]);
    ledger_.Free(run.outputs[i]);
    ledger_.Free(dout);
    dout = din;
  }
  if (reduce) FinishReductions();
  return dout;
}

// Scalars reduced through device memory (Engine::AllReduceScalar on a GPU).
void RankReplay::Scalars() {
  if (in_.gpu && (in_.dp > 1 || in_.pp > 1 || in_.tp > 1)) {
    Transient(MemoryCategory::kCommunication, kF32, Where::kDevice);
  }
}

// Engine::OptimizerStep: with parameters on NVMe HostAdamStep stages one layer's shard at a
// time, the next made before the previous is let go; stages 1-2 then all-gather.
void RankReplay::OptimizerStep() {
  if (host_adam_ && param_nvme_) {
    Id staged = 0;
    for (const LayerLayout& l : layers_) {
      const Id next = ledger_.Alloc(MemoryCategory::kParameters, l.shard * kF32, staging());
      ledger_.Free(staged);
      staged = next;
    }
    ledger_.Free(staged);
  }
  if ((stage_ == 1 || stage_ == 2) && in_.dp > 1) GatherParameters();
}

// Engine::GatherParameters: a send copy of each shard, at most allgather_bucket_size
// gathered elements in flight.
void RankReplay::GatherParameters() {
  std::deque<std::pair<Id, int64_t>> flight;
  int64_t in_flight = 0;
  for (const LayerLayout& l : layers_) {
    while (!flight.empty() && in_flight + l.padded > z_.allgather_bucket_size) {
      ledger_.Free(flight.front().first);
      in_flight -= flight.front().second;
      flight.pop_front();
    }
    flight.emplace_back(
        ledger_.Alloc(MemoryCategory::kCommunication, l.shard * kF32, Where::kDevice), l.padded);
    in_flight += l.padded;
  }
  for (auto& f : flight) ledger_.Free(f.first);
}

// Engine::SumStageTiedGradients: the other stage's gradient of a shared weight (dp rank 0's
// range).
void RankReplay::SumStageTiedGradients() {
  for (const LayerLayout& l : layers_) {
    if (l.stage_tie > 0) {
      Transient(MemoryCategory::kCommunication, std::min(l.stage_tie, opt_len(l)) * kF32,
                Where::kDevice);
    }
  }
}

// Engine::StartGatherPlan: the same zero::PlanGathers plan over the step's positions.
void RankReplay::StartGatherPlan(const std::vector<bool>& phases) {
  std::vector<int64_t> sizes;
  for (const LayerLayout& l : layers_) sizes.push_back(l.padded);
  std::vector<zero::UnitUse> uses;
  for (const bool backward : phases) {
    for (size_t i = 0; i < n(); ++i) uses.push_back(layers_[backward ? n() - 1 - i : i].units);
  }
  const zero::GatherLimits limits{.prefetch_bucket = z_.stage3_prefetch_bucket_size,
                                  .max_live = z_.stage3_max_live_parameters,
                                  .max_reuse_distance = z_.stage3_max_reuse_distance,
                                  .persistence_threshold = z_.stage3_param_persistence_threshold};
  plan_ = zero::PlanGathers(sizes, uses, limits);
  position_ = 0;
}

// Engine::GatherForUse / LaunchGather: the whole layer, in the compute dtype; with shards on
// NVMe each shard passes through a host copy on a GPU or when it is converted to 16 bits.
void RankReplay::GatherForUse(size_t) {
  for (size_t u : plan_.actions[position_].fetch) {
    gathered_[u] =
        ledger_.Alloc(MemoryCategory::kParameters, layers_[u].padded * act_bytes_, Where::kDevice);
    if (param_nvme_ && (in_.gpu || in_.compute != DType::kF32)) {
      Transient(MemoryCategory::kWorkspace, layers_[u].shard * kF32, Where::kHost);
    }
  }
}

void RankReplay::ReleaseAfterUse() {
  for (size_t u : plan_.actions[position_].release) ledger_.Free(gathered_[u]);
  ++position_;
}

void RankReplay::AllocateFullGradients(size_t l) {
  if (grads_[l] == 0) {
    grads_[l] =
        ledger_.Alloc(MemoryCategory::kGradients, layers_[l].padded * grad_bytes_, Where::kDevice);
  }
}

// engine_zero.cc: OnGradientsReady, LaunchBucket, FinishReductions.
void RankReplay::OnGradientsReady(size_t l) {
  pending_.push_back(l);
  pending_elements_ += layers_[l].padded;
  if (pending_elements_ >= z_.reduce_bucket_size || l == 0) LaunchBucket();
}

void RankReplay::LaunchBucket() {
  if (stage_ >= 2) FinishReductions();
  for (size_t l : pending_) {
    if (grads16_ && stage_ >= 1) {  // Engine::Fp32Gradients: reduced in fp32
      grads32_[l] =
          ledger_.Alloc(MemoryCategory::kCommunication, layers_[l].padded * kF32, Where::kDevice);
    }
    if (stage_ >= 2 && z_.reduce_scatter) {
      grad_recv_[l] =
          ledger_.Alloc(MemoryCategory::kCommunication, layers_[l].shard * kF32, Where::kDevice);
    }
    launched_.push_back(l);
  }
  pending_.clear();
  pending_elements_ = 0;
  if (!overlap_) FinishReductions();
}

void RankReplay::FinishReductions() {
  for (size_t l : launched_) {
    ledger_.Free(grads32_[l]);
    if (stage_ < 2) continue;
    ledger_.Free(grad_recv_[l]);
    ledger_.Free(grads_[l]);
  }
  launched_.clear();
}

}  // namespace

MemoryEstimate ReplayRank(const EstimateInput& in, const StageLayout& layout) {
  return RankReplay(in, layout).Run();
}

}  // namespace ztrain::detail
