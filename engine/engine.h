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
// Pipeline parallelism (Note [Pipeline in the engine], engine_pipeline.cc): given a pipeline
// group of P ranks, the engine is handed the whole model, partitions it into P contiguous
// layer ranges (pipeline.partition) and keeps the range of its stage (its pp rank); TrainStep
// runs the stage's instruction list (pipeline.schedule: 1F1B or GPipe), passing activations
// and their gradients to the neighbouring stages. A weight tied across stages (GPT-2's token
// embedding and LM head) is held by both stages, laid out identically, and its gradients are
// summed between them before the step, so both copies stay equal.
//
// Tensor parallelism: given a tp group, the layers are the tensor-parallel ones, which run
// their own collectives on it; the engine initialises each slice from the whole parameter's
// indices (ParamSpec::tp), gathers slices when whole values are asked for, and counts
// parameters that every tp rank holds whole once in the gradient norm.
//
// Mixed precision (Note [Mixed precision in the engine], engine_precision.cc): with bf16 or
// fp16 the layers compute with a 16-bit copy of the parameters and 16-bit activations, while
// the optimizer keeps fp32 master weights and Adam state; gradients accumulate in
// data_types.grad_accum_dtype and are reduced in fp32. fp16 scales the loss dynamically and
// skips steps whose gradients overflow on any rank.
//
// Devices (Note [Devices in the engine], engine_device.cc): config.device names where the
// engine computes ("cpu", "cuda:N"; "auto" is cuda:0 when a GPU is visible, else cpu). On a
// CUDA device the ops are CudaOps, the model state and activations live in device memory,
// and the groups must be NCCL communicators (device memory); micro-batches, whole-parameter
// values and checkpoints stay on the host and are copied. Parameter() and Gradient() are
// views of device memory there.
//
// The engine knows nothing of the CLI, files or data sources: it is the piece research code
// embeds (examples/custom_layer). Not thread safe; one step at a time. Errors throw.
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
  // Time the engine blocked on NVMe swaps (parameter shards read for gathers and the
  // optimizer, optimizer-state tiles): the part of the swapping not hidden behind compute.
  double swap_wait_seconds = 0.0;
  // fp16 (Note [Mixed precision in the engine]): the loss scale the step ran with, whether
  // the step was skipped for an overflow (counted, but no update), and the skipped steps so
  // far. loss_scale is 0 without fp16.
  double loss_scale = 0.0;
  bool skipped = false;
  int64_t skipped_steps = 0;
};

// The groups a rank trains in (not owned; they must outlive the engine). Null: a group of one.
struct ParallelGroups {
  comm::Communicator* dp = nullptr;  // the ranks holding the same layers (data parallel)
  comm::Communicator* pp = nullptr;  // the rank's pipeline: stage s is pp rank s
  comm::Communicator* tp = nullptr;  // the ranks splitting each layer (tensor parallel)
};

// How the engine's parameters start.
enum class InitialParameters {
  kRandom,  // from training.seed (nn/init.h): every layout starts from the single-process model
  kZero,    // zero, for a caller that sets them next (SetHeldParameters from model.init_from):
            // a large model does not pay for random values it overwrites
};

class Engine {
 public:
  // `layers` is the whole model; with a pipeline group of P > 1 ranks the engine keeps its
  // stage's layers only. With a tp group the layers are the tensor-parallel ones
  // (tensor::BuildParallelModel): each parameter is the rank's slice (ParamSpec::tp).
  Engine(Config config, std::vector<std::unique_ptr<nn::Layer>> layers, ParallelGroups groups,
         InitialParameters initial = InitialParameters::kRandom);
  // A shape-only engine on `device` (Note [Shape-only engine], estimate/shape_only.h): every
  // buffer is counted by the trackers and none holds data, the ops compute nothing, no swap
  // file is made; the groups must move nothing either. It runs the engine's own code, so its
  // trackers after construction and one TrainStep are what a real run's would be: the memory
  // estimate (estimate/estimate.h). Losses, norms and parameters are meaningless.
  struct ShapeOnly {
    Device device;
  };
  Engine(Config config, std::vector<std::unique_ptr<nn::Layer>> layers, ParallelGroups groups,
         ShapeOnly shape_only);
  // `dp` is the data-parallel group (not owned; must outlive the engine); null = one process.
  Engine(Config config, std::vector<std::unique_ptr<nn::Layer>> layers,
         comm::Communicator* dp = nullptr)
      : Engine(std::move(config), std::move(layers), ParallelGroups{dp, nullptr, nullptr}) {}
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // One optimizer step over this rank's `micro_batches` (normally gradient_accumulation_steps
  // of them); every rank of the dp group calls it with the same number, and every stage of a
  // pipeline with the same micro-batches. The loss and token count in the result are over
  // the global batch (all ranks), on every stage.
  StepStats TrainStep(std::span<const nn::MicroBatch> micro_batches);
  // Mean per-token loss of one micro-batch without touching gradients or parameters (every
  // stage of a pipeline calls it and gets the loss).
  double EvalLoss(const nn::MicroBatch& mb);

  // Building blocks of TrainStep, for tests and custom loops (one pipeline stage only).
  void ZeroGrad();
  // Forward + backward of one micro-batch; gradients of the objective
  // loss_weight * mean(per-token loss) accumulate locally (no communication). Returns the mean
  // per-token loss and, when `stats` is given, adds the forward and backward wall times.
  double ForwardBackward(const nn::MicroBatch& mb, float loss_weight, StepStats* stats = nullptr);
  // Global gradient norm (before clipping) of the reduced gradients.
  double GradNorm();
  // Mean of `value` over the dp group (collective).
  double MeanOverDp(double value);
  // Clips, steps AdamW with the scheduled lr and advances the step counter. `grad_norm` is
  // the norm of the gradients as held, so under fp16 still multiplied by the loss scale,
  // which the step removes.
  void OptimizerStep(double grad_norm, StepStats& stats);

  // Parameter / gradient views by name (tied names resolve to their owner). Gradients are
  // this rank's local sums; at stages 2 and 3 they are not kept and Gradient() throws, and at
  // stage 3 neither are whole parameters: Parameter() throws (use ForEachFullParameter).
  Tensor Parameter(const std::string& name) const;
  Tensor Gradient(const std::string& name) const;
  Shape ParameterShape(const std::string& name) const;
  // False for a frozen parameter (Note [Frozen regions], parallel/zero/frozen_regions.h): no
  // gradient, and Parameter() is its value in the compute dtype, or for a quantized one (Note
  // [Quantized base], nn/adapters.h) its blob's bytes (U8; ForEachFullParameter dequantizes).
  bool Trainable(const std::string& name) const;
  // Calls fn(name, value) for every owned parameter, in model order, with its whole value
  // (valid during the call only). At stage 3 this is collective: every rank of the dp group
  // calls it, and each layer is gathered in turn. Under tensor parallelism it is collective
  // over the tp group too, which all-gathers the slices of split parameters. With
  // `trainable_only` the frozen parameters are left out (and not gathered).
  void ForEachFullParameter(const std::function<void(const std::string&, const Tensor&)>& fn,
                            bool trainable_only = false);
  // Sets every owned parameter: fill(name, destination) writes its whole value. Every rank
  // must write the same values; at stage 3 each keeps its shard, under tensor parallelism
  // its slice. Not collective.
  void SetFullParameters(const std::function<void(const std::string&, const Tensor&)>& fill);
  // Sets the parameter elements this rank holds and no others (Note [Reading only what a
  // rank holds], engine_params.cc): fill(name, full_shape, begin, count, out) writes elements
  // [begin, begin + count) of the whole parameter `name` (row-major in full_shape) to `out`,
  // once for each contiguous run of them in this rank's stage, tp slice and ZeRO-3 shard.
  // Every rank must write the values of the same whole model. Not collective.
  using HeldParameterFill = std::function<void(const std::string& name, const Shape& full_shape,
                                               int64_t begin, int64_t count, float* out)>;
  // With `only`, the parameters it accepts and no others (the rest keep their values: a PEFT
  // adapter loaded over a base).
  void SetHeldParameters(const HeldParameterFill& fill,
                         const std::function<bool(const std::string&)>& only = {});
  // The values training.seed gives elements [begin, begin + count) of whole parameter `name`
  // (nn/init.h): what a parameter no file sets starts from (a LoRA adapter over a loaded
  // base).
  void InitialValues(const std::string& name, int64_t begin, int64_t count, float* out) const;
  std::vector<std::string> ParameterNames() const;  // owned parameters, model order
  // The whole model's parameters (every stage's, each tied weight once), in model order.
  std::vector<std::pair<std::string, Shape>> ModelParameters() const;
  // Calls fn(name, value) for every parameter of ModelParameters(), whole, on the rank at
  // dp 0, pp 0, tp 0, and for none elsewhere: later stages send theirs. Collective over the
  // dp, pp and tp groups. With `trainable_only` the frozen parameters are left out (a LoRA
  // run's adapter).
  void ForEachModelParameter(const std::function<void(const std::string&, const Tensor&)>& fn,
                             bool trainable_only = false);
  // The parameter groups (Note [Parameter groups]) with the whole model's tensors and
  // elements in each (every stage's, each tied weight once), in group order.
  struct ParamGroupUse {
    optim::ParamGroup group;
    int64_t tensors = 0, elements = 0;
  };
  std::vector<ParamGroupUse> ParamGroupUses() const;
  int64_t NumParameters() const;                    // owned elements, without padding
  // The owned elements that train (the rest are frozen: Note [Frozen regions]).
  int64_t NumTrainableParameters() const;
  // Matmul FLOPs of forward + backward per token at sequence length T (3x forward).
  double TrainFlopsPerToken(int64_t seq_len) const;

  // Checkpoints (Note [Checkpoints in the engine], checkpoint/trained_state.h): SaveState appends
  // the elements this rank is responsible for (each element of the model is saved by exactly
  // one rank) to `writer`; LoadState sets every element this rank holds, in its own layout,
  // from a checkpoint written by any layout, and the step counter. Swapped-out state streams
  // through the swappers. Neither is collective.
  void SaveState(checkpoint::ShardWriter& writer);
  void LoadState(const checkpoint::ModelIndex& index, int64_t step);
  // fp16's loss scaler state for the checkpoint's meta.json (null without fp16), and its
  // restore (a null state, from a run without fp16, leaves the scaler as configured).
  nlohmann::json LossScalerState() const;
  void RestoreLossScaler(const nlohmann::json& state);
  // The fp32 GEMM backend of each shape (Note [GEMMs chosen by measurement] in
  // kernels/cpu/gemm_choice.h), given to the ops; a checkpoint records it, so that a resume
  // computes as the saved run did. OpenBLAS for every shape until set.
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
  // Where the engine computes (resolved from config.device).
  Device device() const { return device_; }
  // Every byte the engine allocates, by category; and the same split by where it lives: the
  // device (on the CPU backend, all of it), host memory (on a GPU: offloaded state, staging
  // copies, swap buffers), and the page-locked part of that (pin_memory state, swap buffers;
  // counted in the device's figures on the CPU backend).
  MemoryTracker& memory() { return memory_.all(); }
  const MemoryTracker& device_memory() const { return memory_.device(); }
  const MemoryTracker& host_memory() const { return memory_.host(); }
  const MemoryTracker& pinned_memory() const { return memory_.pinned(); }
  // The rank's flat parameter buffers summed: NumParameters() with each layer's padding
  // (Note [ZeRO in the engine]); at ZeRO stage 3 the rank holds 1/dp of it.
  int64_t PaddedParameters() const;
  // Bytes of the rank's swap files (NVMe offload; 0 without).
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
  // The micro-batches' tokens and targets on the engine's device (the same views on the CPU).
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
  // The gradient of the objective loss_weight * mean(per-token loss) w.r.t. the losses.
  Buffer LossGradient(const Shape& shape, float loss_weight);
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

  Engine(Config config, std::vector<std::unique_ptr<nn::Layer>> layers, ParallelGroups groups,
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
  // The whole model as this pipeline stage holds it: its boundaries, the weights it shares
  // with another stage, every layer's parameters (Note [Pipeline in the engine]).
  std::unique_ptr<pipeline::StageModel> stage_;
  const zero::StagePolicy zero_;     // what the ZeRO stage shards (Note [ZeRO stage policy])
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
