#pragma once
// Engine: trains a model given as a list of layers, configured by a Config.
//
// Owns everything the model state needs: one flat parameter buffer per layer (parameter
// views point into it), a mirroring flat gradient buffer, the AdamW state (m, v), the
// activations of the micro-batch in flight (through a caching allocator), and the
// MemoryTracker that counts all of it by category. Parameters are initialised from
// (training.seed, parameter name, element index) only (nn/init.h). A train step runs
// forward and backward for each micro-batch (gradients accumulate), clips by global norm,
// and takes one AdamW step with the scheduled learning rate.
//
// Data parallelism and ZeRO (Note [ZeRO in the engine]): given a data-parallel communicator
// of N ranks, each rank runs its own micro-batches and the engine reduces gradients as
// DeepSpeed does for zero_optimization.stage: 0 all-reduces gradient buckets while backward
// goes on and every rank steps everything; 1 reduce-scatters them at the accumulation
// boundary, each rank steps only its shard of every layer (fp32 master, m, v) and the
// updated shards are all-gathered; 2 reduce-scatters each bucket into the owner's shard
// during the backward of every micro-batch and keeps no full gradients; 3 also keeps only
// the parameter shard, gathering each layer before it runs (prefetching the next ones within
// the stage3_* limits) and releasing it after. Flat buffers are padded so they split into N
// equal shards. Every layout trains the same model as one process with the global batch.
//
// Offload (Note [Offload in the engine]): zero_optimization.offload_optimizer / offload_param
// put m and v (stages 1-3) and the parameter shards (stage 3) in pinned host memory or in
// swap files under nvme_path, streamed through by the offload/ swappers; results are
// bitwise those of the same layout without offload.
//
// The engine knows nothing of the CLI, files or data sources: it is the piece research code
// embeds (examples/custom_layer). Not thread safe; one step at a time. Errors throw.
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/buffer.h"
#include "core/caching_allocator.h"
#include "core/config.h"
#include "core/memory_tracker.h"
#include "kernels/ops.h"
#include "nn/layer.h"
#include "optim/lr_schedule.h"
#include "parallel/comm/communicator.h"
#include "parallel/zero/gather_plan.h"

namespace ztrain {

namespace offload {
class IoEngine;
class OptimizerSwapper;
class ParamSwapper;
class SwapDir;
}  // namespace offload

struct StepStats {
  int64_t step = 0;          // 1-based number of the optimizer step just taken
  double loss = 0.0;         // mean per-token loss over the global batch, before the update
  double grad_norm = 0.0;    // global gradient norm before clipping
  double lr = 0.0;           // learning rate used by this step
  double clip_coef = 1.0;    // gradient scale applied by clipping (1 = not clipped)
  int64_t tokens = 0;        // tokens processed by this step
  double seconds = 0.0;      // wall time of the step
  // The step's wall time split as DeepSpeed's wall_clock_breakdown reports it.
  double forward_seconds = 0.0;
  double backward_seconds = 0.0;
  double optimizer_seconds = 0.0;  // gradient norm, clipping and AdamW
  // Time the engine blocked waiting for communication (gradient reductions, parameter
  // gathers): the part of the communication not hidden behind compute.
  double comm_wait_seconds = 0.0;
};

class Engine {
 public:
  // `dp` is the data-parallel group (not owned; must outlive the engine); null = one process.
  Engine(Config config, std::vector<std::unique_ptr<nn::Layer>> layers,
         comm::Communicator* dp = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // One optimizer step over this rank's `micro_batches` (normally gradient_accumulation_steps
  // of them); every rank of the dp group calls it with the same number. The loss and token
  // count in the result are over the global batch (all ranks).
  StepStats TrainStep(std::span<const nn::MicroBatch> micro_batches);
  // Mean per-token loss of one micro-batch without touching gradients or parameters.
  double EvalLoss(const nn::MicroBatch& mb);

  // Building blocks of TrainStep, for tests and custom loops.
  void ZeroGrad();
  // Forward + backward of one micro-batch; gradients of the objective
  // loss_weight * mean(per-token loss) accumulate locally (no communication). Returns the mean
  // per-token loss and, when `stats` is given, adds the forward and backward wall times.
  double ForwardBackward(const nn::MicroBatch& mb, float loss_weight, StepStats* stats = nullptr);
  // Global gradient norm (before clipping) of the reduced gradients.
  double GradNorm() const;
  // Mean of `value` over the dp group (collective).
  double MeanOverDp(double value);
  // Clips, steps AdamW with the scheduled lr and advances the step counter.
  void OptimizerStep(double grad_norm, StepStats& stats);

  // Parameter / gradient views by name (tied names resolve to their owner). Gradients are
  // this rank's local sums; at stages 2 and 3 they are not kept and Gradient() throws, and at
  // stage 3 neither are whole parameters: Parameter() throws (use ForEachFullParameter).
  Tensor Parameter(const std::string& name) const;
  Tensor Gradient(const std::string& name) const;
  Shape ParameterShape(const std::string& name) const;
  // Calls fn(name, value) for every owned parameter, in model order, with its whole value
  // (valid during the call only). At stage 3 this is collective: every rank of the dp group
  // calls it, and each layer is gathered in turn.
  void ForEachFullParameter(const std::function<void(const std::string&, const Tensor&)>& fn);
  // Sets every owned parameter: fill(name, destination) writes its whole value. Every rank
  // must write the same values; at stage 3 each keeps its shard. Not collective.
  void SetFullParameters(const std::function<void(const std::string&, const Tensor&)>& fill);
  std::vector<std::string> ParameterNames() const;  // owned parameters, model order
  int64_t NumParameters() const;                    // owned elements, without padding
  // Matmul FLOPs of forward + backward per token at sequence length T (3x forward).
  double TrainFlopsPerToken(int64_t seq_len) const;

  int64_t step() const { return step_; }
  int dp_rank() const { return dp_->rank(); }
  int dp_size() const { return dp_->size(); }
  comm::Communicator& dp() { return *dp_; }
  const Config& config() const { return config_; }
  MemoryTracker& memory() { return tracker_; }
  kernels::Ops& ops() { return *ops_; }
  const std::vector<std::unique_ptr<nn::Layer>>& layers() const { return layers_; }

 private:
  struct Slot;
  struct LayerState;
  void BuildStorage();
  void SetUpOffload();
  void InitParameters();
  comm::WorkPtr LaunchGather(size_t layer, const Buffer& whole);
  double ForwardBackwardImpl(const nn::MicroBatch& mb, float loss_weight, StepStats* stats,
                             bool reduce);
  void BindLayer(size_t layer);
  void AllocateFullGradients(size_t layer);
  void WaitFor(comm::Work& work);
  // Gradient buckets.
  void OnGradientsReady(size_t layer);
  void LaunchBucket();
  void FinishReductions();
  void GatherParameters();
  // Stage 3 parameter gathering.
  void StartGatherPlan(int micro_batches, bool backward);
  void GatherForUse(size_t layer);
  void ReleaseAfterUse();
  void ReleaseAllGathered();
  const Slot& FindSlot(const std::string& name) const;

  Config config_;
  std::vector<std::unique_ptr<nn::Layer>> layers_;
  MemoryTracker tracker_;
  HostAllocator host_;        // model state: parameters, gradients, optimizer state
  HostAllocator raw_host_;    // untracked upstream of the caching allocator
  PinnedHostAllocator pinned_;  // offloaded state with pin_memory
  CachingAllocator activations_;
  std::unique_ptr<comm::Communicator> self_comm_;  // the dp group when none is given
  comm::Communicator* dp_;
  int stage_;
  bool overlap_;  // let gradient reductions run behind backward (stage 0, or overlap_comm)
  std::unique_ptr<kernels::Ops> ops_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::vector<std::unique_ptr<LayerState>> states_;
  std::vector<Slot> slots_;
  std::unordered_map<std::string, size_t> slot_by_name_;
  int64_t step_ = 0;
  double comm_wait_seconds_ = 0.0;  // blocked in WaitFor, since construction
  // Gradient buckets: layers waiting to be reduced, and layers whose reduction is in flight.
  std::vector<size_t> pending_, launched_;
  int64_t pending_elements_ = 0;
  // Stage 3: gather plans by (micro-batches, with backward), the one running and its position.
  std::map<int, zero::GatherPlan> plans_;
  const zero::GatherPlan* plan_ = nullptr;
  size_t position_ = 0;
  // Offload (Note [Offload in the engine]): the I/O engine, swap directories, and where
  // parameter shards and optimizer state live when they are on NVMe.
  std::unique_ptr<offload::IoEngine> io_;
  std::vector<std::unique_ptr<offload::SwapDir>> swap_dirs_;
  std::unique_ptr<offload::ParamSwapper> param_swap_;
  std::unique_ptr<offload::OptimizerSwapper> opt_swap_;
};

}  // namespace ztrain
