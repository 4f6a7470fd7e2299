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
// embeds (examples/custom_layer). Not thread safe; one step at a time. Errors throw. This
// header is its whole face: the parts behind it (EngineImpl, engine/engine_impl.h, and the
// parts it composes: docs/architecture.md) are private to engine/.
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/device.h"
#include "core/memory_tracker.h"
#include "core/tensor.h"
#include "kernels/gemm_plan.h"
#include "kernels/ops.h"
#include "nn/layer.h"
#include "optim/param_groups.h"
#include "parallel/comm/communicator.h"

namespace ztrain {

class EngineImpl;

namespace checkpoint {
class ShardWriter;
class ModelIndex;
}  // namespace checkpoint

struct StepStats {
  int64_t step = 0;        // 1-based number of the optimizer step just taken
  double loss = 0.0;       // mean per-token loss over the global batch, before the update
  double grad_norm = 0.0;  // global gradient norm before clipping
  double lr = 0.0;         // learning rate used by this step
  double clip_coef = 1.0;  // gradient scale applied by clipping (1 = not clipped)
  int64_t tokens = 0;      // tokens processed by this step
  double seconds = 0.0;    // wall time of the step
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
  // Packed documents (data.packed_documents): the documents the global batch held (tokens at
  // position 0, a window's first included); 0 otherwise.
  int64_t documents = 0;
};

// The groups a rank trains in (not owned; they must outlive the engine). Null: a group of one.
struct ParallelGroups {
  // The ranks holding the same layers, whose gradients are reduced together: data parallel,
  // or with context parallelism the dp x cp group (GridCommunicators::gradients()).
  comm::Communicator* dp = nullptr;
  comm::Communicator* pp = nullptr;  // the rank's pipeline: stage s is pp rank s
  comm::Communicator* tp = nullptr;  // the ranks splitting each layer (tensor parallel)
  // The ranks splitting each sequence (Note [Context parallelism], nn/context_parallel.h), a
  // subgroup of dp in which group rank = data-parallel index x cp size + cp rank; null: none.
  // The layers exchange over it themselves; the engine reads its rank and size.
  comm::Communicator* cp = nullptr;
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
  // the global batch (all ranks), on every stage. Targets equal to kIgnoreTarget take
  // no loss; with data.packed_documents the loss is the mean over the global batch's other
  // targets (Note [Loss over real targets], engine_step.cc).
  StepStats TrainStep(std::span<const nn::MicroBatch> micro_batches);
  // Mean per-token loss of one micro-batch without touching gradients or parameters (every
  // stage of a pipeline calls it and gets the loss). Under context parallelism every rank of
  // the cp group calls it with its piece and gets the whole sequences' mean.
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
  int64_t NumParameters() const;  // owned elements, without padding
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
  void UseGemmPlan(const kernels::GemmPlan& plan);
  const kernels::GemmPlan& gemm_plan() const;

  int64_t step() const;
  int dp_rank() const;
  int dp_size() const;
  comm::Communicator& dp();
  int pp_rank() const;
  int pp_size() const;
  comm::Communicator& pp();
  int tp_rank() const;
  int tp_size() const;
  const Config& config() const;
  // Where the engine computes (resolved from config.device).
  Device device() const;
  // Every byte the engine allocates, by category; and the same split by where it lives: the
  // device (on the CPU backend, all of it), host memory (on a GPU: offloaded state, staging
  // copies, swap buffers), and the page-locked part of that (pin_memory state, swap buffers;
  // counted in the device's figures on the CPU backend).
  MemoryTracker& memory();
  const MemoryTracker& device_memory() const;
  const MemoryTracker& host_memory() const;
  const MemoryTracker& pinned_memory() const;
  // The rank's flat parameter buffers summed: NumParameters() with each layer's padding
  // (Note [ZeRO in the engine]); at ZeRO stage 3 the rank holds 1/dp of it.
  int64_t PaddedParameters() const;
  // Bytes of the rank's swap files (NVMe offload; 0 without).
  int64_t swap_file_bytes() const;
  kernels::Ops& ops();
  const std::vector<std::unique_ptr<nn::Layer>>& layers() const;

 private:
  std::unique_ptr<EngineImpl> impl_;  // engine/engine_impl.h
};

}  // namespace ztrain
