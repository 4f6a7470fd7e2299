#pragma once
// EngineImpl: the engine behind Engine's narrow face (engine.h, which says what each method
// does): the parts it composes and the step executor, private to engine/ (the leveldb
// DB/DBImpl split). Its methods are defined in the engine/engine*.cc files.
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/buffer.h"
#include "core/caching_allocator.h"
#include "core/config.h"
#include "core/memory_tracker.h"
#include "engine/engine.h"
#include "engine/state_memory.h"
#include "kernels/ops.h"
#include "nn/layer.h"
#include "offload/placement.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/param_groups.h"
#include "parallel/comm/communicator.h"
#include "parallel/pipeline/stage_split.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/gradient_reducer.h"
#include "parallel/zero/param_gatherer.h"
#include "parallel/zero/sharded_optimizer.h"
#include "parallel/zero/stage_policy.h"

namespace ztrain {

class ActivationCheckpointing;
class WholeParameters;

namespace checkpoint {
class ShardWriter;
class ModelIndex;
}  // namespace checkpoint

namespace pipeline {
struct Instruction;
}  // namespace pipeline

namespace offload {
class NvmeOffload;
class OptimizerStateStore;
class ParamStore;
}  // namespace offload

namespace zero {
class FrozenRegions;
class ParamTable;
struct ParamSlot;
}  // namespace zero

class EngineImpl {
 public:
  EngineImpl(Config config, std::vector<std::unique_ptr<nn::Layer>> layers, ParallelGroups groups,
             InitialParameters initial);
  using ShapeOnly = Engine::ShapeOnly;
  EngineImpl(Config config, std::vector<std::unique_ptr<nn::Layer>> layers, ParallelGroups groups,
             ShapeOnly shape_only);
  ~EngineImpl();
  EngineImpl(const EngineImpl&) = delete;
  EngineImpl& operator=(const EngineImpl&) = delete;

  StepStats TrainStep(std::span<const nn::MicroBatch> micro_batches);
  double EvalLoss(const nn::MicroBatch& mb);

  void ZeroGrad();
  double ForwardBackward(const nn::MicroBatch& mb, float loss_weight, StepStats* stats = nullptr);
  double GradNorm();
  double MeanOverDp(double value);
  void OptimizerStep(double grad_norm, StepStats& stats);

  Tensor Parameter(const std::string& name) const;
  Tensor Gradient(const std::string& name) const;
  Shape ParameterShape(const std::string& name) const;
  bool Trainable(const std::string& name) const;
  void ForEachFullParameter(const std::function<void(const std::string&, const Tensor&)>& fn,
                            bool trainable_only = false);
  void SetFullParameters(const std::function<void(const std::string&, const Tensor&)>& fill);
  using HeldParameterFill = Engine::HeldParameterFill;
  void SetHeldParameters(const HeldParameterFill& fill,
                         const std::function<bool(const std::string&)>& only = {});
  void InitialValues(const std::string& name, int64_t begin, int64_t count, float* out) const;
  std::vector<std::string> ParameterNames() const;  // owned parameters, model order
  std::vector<std::pair<std::string, Shape>> ModelParameters() const;
  void ForEachModelParameter(const std::function<void(const std::string&, const Tensor&)>& fn,
                             bool trainable_only = false);
  using ParamGroupUse = Engine::ParamGroupUse;
  std::vector<ParamGroupUse> ParamGroupUses() const;
  int64_t NumParameters() const;  // owned elements, without padding
  int64_t NumTrainableParameters() const;
  double TrainFlopsPerToken(int64_t seq_len) const;

  void SaveState(checkpoint::ShardWriter& writer);
  void LoadState(const checkpoint::ModelIndex& index, int64_t step);
  nlohmann::json LossScalerState() const;
  void RestoreLossScaler(const nlohmann::json& state);
  void UseGemmPlan(const kernels::GemmPlan& plan) {
    gemm_plan_ = plan;
    ops_->UseGemmPlan(plan);
  }
  const kernels::GemmPlan& gemm_plan() const { return gemm_plan_; }

  int64_t step() const { return step_; }
  int dp_rank() const { return dp_->rank(); }
  int dp_size() const { return dp_->size(); }
  comm::Communicator& dp() { return *dp_; }
  int pp_rank() const { return pp_->rank(); }
  int pp_size() const { return pp_->size(); }
  comm::Communicator& pp() { return *pp_; }
  int tp_rank() const { return tp_->rank(); }
  int tp_size() const { return tp_->size(); }
  const Config& config() const { return config_; }
  Device device() const { return device_; }
  MemoryTracker& memory() { return memory_.all(); }
  const MemoryTracker& device_memory() const { return memory_.device(); }
  const MemoryTracker& host_memory() const { return memory_.host(); }
  const MemoryTracker& pinned_memory() const { return memory_.pinned(); }
  int64_t PaddedParameters() const;
  int64_t swap_file_bytes() const { return swap_file_bytes_; }
  kernels::Ops& ops() { return *ops_; }
  const std::vector<std::unique_ptr<nn::Layer>>& layers() const { return layers_; }

 private:
  using Slot = zero::ParamSlot;
  struct LayerState;
  struct MicroBatchRun;
  // The sharded optimizer (engine_optimizer.cc, Note [Sharded optimizer]) and its hooks.
  void SetUpOptimizer();
  zero::OptimizerHooks OptimizerHooksFor();
  // Devices (engine_device.cc).
  struct StagedBatches;
  static Device ResolveDevice(const std::string& setting);
  bool on_device() const { return !device_.is_cpu(); }
  using Place = offload::Place;
  // The micro-batches' tokens, targets and positions on the engine's device (the same views on
  // the CPU).
  StagedBatches StageBatches(std::span<const nn::MicroBatch> micro_batches);
  // A tensor's values on the host (waits for the ops that produce it); a shape-only engine's
  // tensors have none, and one zero stands for them.
  std::vector<float> ToHost(const Tensor& t);
  // Copies between host memory and a tensor on the engine's device (or the host), in order
  // with the ops; Synchronize before reading or reusing the host side.
  void CopyIn(const float* host, const Tensor& dst);
  void CopyOut(const Tensor& src, float* host);
  // `value` reduced over `group`, through device memory when the group needs it.
  float AllReduceScalar(comm::Communicator& group, float value,
                        comm::ReduceOp op = comm::ReduceOp::kSum);
  // Builds checkpointing_ (Note [Activation checkpointing in the engine]).
  void SetUpCheckpointing();
  void SelectStage(std::vector<std::unique_ptr<nn::Layer>> model);
  // Throws ConfigError for a glob of optimizer.param_groups that selects nothing.
  void CheckParamGroups() const;
  // The layers' flat buffers and slots (engine.cc): each layer's parameters as this stage
  // holds them, their layout, its buffers where their state lives, and its slots.
  void BuildStorage();
  void SetUpStores();
  void AllocateState(LayerState& st);
  void SetUpOffload();
  void InitParameters();
  // All-gathers layer l's parameters into `whole`: fp32 (the master values) or, under mixed
  // precision, the compute dtype.
  comm::WorkPtr LaunchGather(size_t layer, const Buffer& whole, DType dtype = DType::kF32);
  // The gather of a shard in host memory into `out` on the device, `mine` being this rank's
  // chunk of it, its copy beside the compute (Note [Offloaded shards beside compute]).
  // Mixed precision (engine_precision.cc).
  bool mixed() const { return act_dtype_ != DType::kF32; }
  // Converts layer l's gradients to fp32 when they accumulate in 16 bits: into `grad_shard`
  // (stage 0, reduced there in place) or a new buffer for the reduction to read.
  Tensor Fp32Gradients(size_t layer, Buffer& staging);
  // The end of a step after the gradients are reduced: the norm, fp16's overflow check and
  // scale update, and the optimizer step unless skipped.
  void FinishStep(StepStats& stats);
  // The step executor (engine_step.cc, Note [One step executor]): one train step's state
  // while its schedule runs, and the execution of its instruction `index`.
  struct ScheduleRun;
  void RunInstruction(const pipeline::Instruction& in, size_t index, ScheduleRun& s);
  void Communicate(const pipeline::Instruction& in, ScheduleRun& s);  // sends and receives
  // The dropout key of micro-batch `micro_batch` of the step being taken (Note [LoRA
  // dropout], nn/modules.h): the same on every rank and layout, its rows placed where the
  // single-process micro-batch has them (this dp rank's come after the lower ranks').
  nn::LayerContext::Dropout DropoutFor(const nn::MicroBatch& mb, int micro_batch) const;
  // The stage's forward of one micro-batch from `input` (the tokens on the first stage), and
  // its backward from the gradient of the stage's output; RunBackward returns the gradient of
  // the stage's input (empty on the first stage).
  void RunForward(const nn::MicroBatch& mb, const Tensor& input, MicroBatchRun& run,
                  StepStats* stats);
  Buffer RunBackward(const nn::MicroBatch& mb, Buffer dout, MicroBatchRun& run, bool reduce,
                     StepStats* stats);
  // The gradient of the objective loss_weight * (sum of the per-token losses) / count w.r.t.
  // the losses (Note [Loss over real targets]).
  Buffer LossGradient(const Shape& shape, float loss_weight, int64_t count);
  // The targets of the global batch that take a loss, and its documents (Note [Loss over
  // real targets]): summed over the dp group.
  struct TargetCounts {
    int64_t targets = 0, documents = 0;
  };
  TargetCounts CountOverDp(std::span<const nn::MicroBatch> micro_batches);
  // Pipeline (engine_pipeline.cc).
  void SumStageTiedGradients();
  double SumOverPipeline(double value);
  void BindLayer(size_t layer);
  void AllocateFullGradients(size_t layer);
  void WaitFor(comm::Work& work);
  // Build reducer_ and, at stage 3, gatherer_ (Notes [Gradient reducer], [Parameter
  // gatherer]).
  void SetUpReducer();
  void SetUpGatherer();

  EngineImpl(Config config, std::vector<std::unique_ptr<nn::Layer>> layers, ParallelGroups groups,
             InitialParameters initial, const ShapeOnly* shape_only);
  std::unique_ptr<kernels::Ops> MakeOps() const;

  Config config_;
  std::vector<std::unique_ptr<nn::Layer>> layers_;
  // False for a shape-only engine (Note [Shape-only engine]): host-side arithmetic and file
  // work are skipped; everything that allocates runs.
  const bool computes_;
  Device device_;
  std::unique_ptr<kernels::Ops> ops_;
  // Every allocator, and the trackers counting what they hold (Note [The engine's memory],
  // engine/state_memory.h).
  StateMemory memory_;
  std::unique_ptr<comm::Communicator> self_comm_;  // the dp group when none is given
  comm::Communicator* dp_;
  std::unique_ptr<comm::Communicator> self_pp_;  // the pp group when none is given
  comm::Communicator* pp_;
  std::unique_ptr<comm::Communicator> self_tp_;  // the tp group when none is given
  comm::Communicator* tp_;
  comm::Communicator* cp_ = nullptr;  // ParallelGroups::cp, when larger than one rank
  int cp_size_ = 1, cp_rank_ = 0;
  // The whole model as this pipeline stage holds it: its boundaries, the weights it shares
  // with another stage, every layer's parameters (Note [Pipeline in the engine]).
  std::unique_ptr<pipeline::StageModel> pipeline_;
  const zero::StagePolicy zero_;  // what the ZeRO stage shards (Note [ZeRO stage policy])
  bool overlap_;  // let gradient reductions run behind backward (stage 0, or overlap_comm)
  // Where each kind of state lives (Note [State placement]).
  const offload::Placement placement_;
  // Which layers rerun their forward in backward, and where their inputs wait (Note
  // [Activation checkpointing in the engine], engine/activation_checkpointing.h).
  std::unique_ptr<ActivationCheckpointing> checkpointing_;
  DType act_dtype_;   // activations and the parameters layers compute with
  DType grad_dtype_;  // gradient accumulation (data_types.grad_accum_dtype)
  std::unique_ptr<optim::LossScaler> scaler_;  // fp16 only
  kernels::GemmPlan gemm_plan_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  optim::ParamGroups param_groups_;  // Note [Parameter groups]; each slot names its group
  std::vector<std::unique_ptr<LayerState>> states_;
  // Where each parameter lives (Note [Parameter table], parallel/zero/param_table.h).
  std::unique_ptr<zero::ParamTable> table_;
  int64_t step_ = 0;
  double comm_wait_seconds_ = 0.0;  // blocked in WaitFor, since construction
  // Blocked on the swappers (parameters and optimizer state), since construction.
  double SwapWaitSeconds() const;
  std::unique_ptr<zero::GradientReducer> reducer_;  // the gradient buckets
  std::unique_ptr<zero::ParamGatherer> gatherer_;   // stage 3's gathers; null below
  // Offload (Note [Offload in the engine]): the I/O engine and swap directories when state is
  // on NVMe (Note [NVMe offload setup]), and where parameters and optimizer state live.
  std::unique_ptr<offload::NvmeOffload> nvme_;
  // Where each layer's held parameters live (Note [Parameter store], offload/param_store.h).
  std::unique_ptr<offload::ParamStore> held_;
  std::unique_ptr<offload::OptimizerStateStore> moments_;  // m and v (Note [Optimizer state store])
  // The frozen parameters' regions, each layer's (Note [Frozen regions],
  // parallel/zero/frozen_regions.h).
  std::unique_ptr<zero::FrozenRegions> frozen_;
  // Parameters in and out as whole values (Note [Whole parameters], engine/whole_params.h).
  std::unique_ptr<WholeParameters> whole_;
  // Note [Deferred optimizer step]: on when parameter shards are on NVMe.
  bool defer_steps_ = false;
  std::unique_ptr<zero::ShardedOptimizer> optimizer_;  // Note [Sharded optimizer]
  int64_t swap_file_bytes_ = 0;
};

}  // namespace ztrain
