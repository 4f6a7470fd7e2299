#pragma once
// Internals of EstimateMemory (engine/estimate.h): the rank's layer layout and the replay of
// its allocations. Private to engine/.
//
// Note [Memory estimate]
// The estimate does not model memory with closed formulas that drift from the code; it
// replays the engine's allocations, in the engine's order, into MemoryTrackers (one for all
// memory, one each for device, host and pinned host memory), so peaks come out as the
// engine's tracker records them:
//   - construction (Engine::BuildStorage, SetUpOffload, InitParameters): per layer the fp32
//     parameters (the shard at stage 3; none on NVMe), full gradients (stages 0-1), m and v
//     of the optimizer range (none on NVMe), the reduced gradient shard (stages >= 1), on a
//     GPU with AdamW on the host the pinned gradient copy and fp32 master; the ParamSwapper's
//     resident shards and swap buffers, the OptimizerSwapper's tile buffers; one layer's
//     staging copy at a time while initialising;
//   - one train step (Engine::TrainStep, RunForward, RunBackward, engine_zero.cc): the staged
//     micro-batches on a GPU; per micro-batch each layer's output, then what its Forward
//     allocates, the loss gradient, then per layer in reverse the input gradient and what its
//     Backward allocates, released with the saved context; stage 3 gathers and
//     releases by zero::PlanGathers; stage 2-3 full gradients per layer, reduced in buckets of
//     reduce_bucket_size with a communication buffer per layer shard, at most two buckets
//     alive with overlap_comm; the pipeline schedule's instruction list at pp > 1; the
//     optimizer step's one-shard staging with parameters on NVMe; the stage 1-2 parameter
//     all-gather's send buffers within allgather_bucket_size.
// What the layers allocate is not listed here: each layer of the stage runs its own Forward
// and Backward once on a shape-only device (ShapeOps: every op a no-op; a TraceAllocator
// handing out untouched address space and recording each allocation and free; a tp group
// that moves nothing), and the replay plays those recorded events where the engine calls the
// layer. So a new layer or family needs no estimate code. The engine-level allocations above
// are replayed here; whoever changes what the engine allocates changes this replay with it,
// and estimate_test measures the engine against it for every stage and offload mode, for
// GPT-2 and Llama. What it leaves out: the MPI backend's ring scratch (not counted by the
// engine's tracker either), memory the kernels or libraries take outside the tracker (cuBLAS
// workspaces, the CUDA context, NCCL's buffers), and caching-allocator blocks held but unused.
#include <cstdint>
#include <vector>

#include "core/config.h"
#include "core/dtype.h"
#include "core/memory_tracker.h"
#include "engine/estimate.h"

namespace ztrain::detail {

// Everything the replay needs besides the layout, resolved from the config and options.
struct EstimateInput {
  const Config* config = nullptr;
  bool gpu = true;
  DType compute = DType::kF32;     // activations, the layers' parameter copies, gathers
  DType grad = DType::kF32;        // gradient accumulation
  std::vector<bool> checkpointed;  // per model block
  // Where a checkpointed block's input waits for its backward (Engine::KeepOnlyInput): in
  // 1/tp parts (partition_activations at tp > 1), in pinned host memory (cpu_checkpointing
  // on a GPU), or (both false) where it is.
  bool partition_checkpoints = false, offload_checkpoints = false;
  int dp = 1, pp = 1, tp = 1, pp_stage = 0;
  int64_t micro_batch = 1, seq_len = 1, grad_accum = 1;
};

// One allocation or free a layer made through its LayerContext's allocator.
struct AllocEvent {
  int64_t bytes = 0;  // of the allocation (the same on its free)
  MemoryCategory category = MemoryCategory::kActivations;
  int id = 0;  // which allocation: numbered from 0 per phase
  bool free = false;
};

// What one layer allocates for one micro-batch, measured by running its own Forward and
// Backward on a shape-only device (MeasureActivations). The allocations a phase does not free
// live until the layer's context is released after its Backward: what Forward saved, the
// scratch Backward keeps.
struct LayerActivations {
  std::vector<AllocEvent> forward;   // in order
  std::vector<AllocEvent> backward;  // in order
  int64_t output = 0;      // the output the engine allocates for it
  int64_t input_grad = 0;  // the gradient of its input (the engine allocates it; 0: tokens)
};

// One layer of the rank's pipeline stage as Engine::BuildStorage lays it out.
struct LayerLayout {
  enum class Kind { kEmbedding, kBlock, kLmHead };
  LayerActivations acts;
  Kind kind = Kind::kBlock;
  int block = -1;             // the model block index (kBlock)
  int64_t owned = 0;          // parameter elements stored in its flat buffer, no padding
  int64_t padded = 0;         // its flat buffer: a multiple of 16 x dp
  int64_t shard = 0;          // padded / dp
  std::vector<size_t> units;  // stage layers whose buffers hold its parameters, in order
  bool tie_owner = false;     // a later layer of the stage uses one of its parameters
  int64_t stage_tie = 0;      // elements of a weight it shares with another pipeline stage
};

struct StageLayout {
  std::vector<LayerLayout> layers;
  int64_t model_parameters = 0;  // the whole model, tied weights once, whole tp shapes
  int64_t rank_parameters = 0;   // the stage's owned elements (Engine::NumParameters)
};

// The layers of pipeline stage in.pp_stage of the model split over in.tp ranks, padded for
// in.dp ranks, each with what it allocates for a micro-batch of in.micro_batch x in.seq_len
// tokens in in.compute (its own Forward and Backward run on a shape-only device). Throws
// ConfigError where the engine would refuse the layout.
StageLayout LayOutStage(const EstimateInput& in);

// The rank's memory: construction, initialisation and one train step replayed.
MemoryEstimate ReplayRank(const EstimateInput& in, const StageLayout& layout);

}  // namespace ztrain::detail
