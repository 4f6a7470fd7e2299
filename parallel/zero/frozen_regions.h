#pragma once
// Note [Frozen regions]
// A frozen parameter (ParamSpec::trainable false: the base of a LoRA fine-tune, nn/adapters.h)
// never changes, so the engine keeps only its value, in the compute dtype: no fp32 master, no
// 16-bit copy, no gradient, no Adam state — 2 bytes a parameter under bf16 where a trained one
// costs 16 or more. Each layer's frozen parameters lie in a region of their own, beside the
// flat buffers of the trained ones, each at a 16-element boundary (a packed run contiguous, as
// in the flat buffers: zero::LayOut places them, flat_layout.h), the region padded to a
// multiple of 64 x dp bytes so that it splits into dp equal shards:
//   - stages 0-2 hold the whole region on every rank (as DeepSpeed keeps frozen parameters
//     whole below stage 3);
//   - stage 3 (`sharded`) holds the rank's shard and all-gathers the region together with
//     the layer's trained parameters, by the same plan (zero::PlanGathers, whose sizes count
//     both), and frees it with them. With offload_param the shard lives in host memory
//     (pinned with pin_memory) and is copied into its chunk of the gathered region before the
//     gather (Note [Offloaded shards beside compute], param_gatherer.h); it is not swapped to
//     NVMe.
// A layer binds a frozen parameter's view into the region (View; gathered at stage 3) and an
// undefined gradient view, so its backward skips the gradient (Note [Frozen parameters],
// kernels/ops.h). Nothing else of the step sees a frozen parameter: the gradient buckets, the
// norm and the optimizer step walk the trained flat buffers only (a layer with no trained
// parameter has none and is skipped). Values go in and out in fp32: initialisation and
// loading (SetHeld) write the rank's part of the region rounded to the compute dtype, whole
// values (Whole, then Values: exports) are widened from it. Checkpoints hold the trained
// state only: a frozen parameter comes back from model.init_from, or from training.seed, as
// it came the first time. A frozen weight tied to another pipeline stage's is held by both
// stages as their own frozen parameters, equal from the start.
//
// A quantized weight (Note [Quantized base], nn/adapters.h) takes its blob's bytes in the
// region instead of its values (a quarter of bf16's for 4-bit, half for INT8), so everything
// above moves the quantized bytes: the stage-3 shards, the gathers, the offloaded shards.
// SetHeld quantizes it from the WHOLE weight (each rank whose part of the region holds some of
// the blob asks `fill` for all of the weight, in fp32, one weight at a time), and Values
// dequantizes it for exports. The layers dequantize it themselves.
//
// FrozenRegions owns the regions (the part each rank holds) and nothing else: the engine
// decides the layout and binds the views; where a region's bytes are allocated and how a
// host shard reaches the collective are its hooks' business.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/buffer.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "nn/layer.h"
#include "parallel/comm/communicator.h"

namespace ztrain::zero {

// One frozen parameter of a layer: its spec (shape, tensor-parallel slice, quantization) and
// where its bytes start in the layer's region.
struct FrozenParam {
  nn::ParamSpec spec;
  int64_t offset = 0;  // bytes
};

// Writes elements [begin, begin + count) of the whole parameter `name` (row-major in
// full_shape), in fp32, to `out` (Engine::HeldParameterFill).
using FrozenFill = std::function<void(const std::string& name, const Shape& full_shape,
                                      int64_t begin, int64_t count, float* out)>;

struct FrozenHooks {
  // A zeroed buffer of `bytes` (U8) where frozen state lives (Note [State placement]).
  std::function<Buffer(int64_t bytes)> allocate;
  // Blocks until `work` is done (the caller times it).
  std::function<void(comm::Work&)> wait;
};

class FrozenRegions {
 public:
  struct Options {
    DType compute = DType::kF32;  // the dtype layers compute with: a frozen value's
    bool sharded = false;         // stage 3: each rank holds its shard of every region
    bool computes = true;         // false for a shape-only engine: no values are made or read
  };
  // `staging` is host memory for fp32 values on their way in (the caching allocator on the
  // CPU backend), `work` where gathered regions go (device memory). None is owned.
  FrozenRegions(Options options, comm::Communicator& dp, kernels::Ops& ops, Allocator& staging,
                Allocator& work, FrozenHooks hooks);

  // The bytes a frozen parameter takes in a region: its values in the compute dtype, or its
  // quantized blob (a multiple of 4).
  int64_t Bytes(const nn::ParamSpec& spec) const;
  // Adds the next layer's region of `padded` bytes (a multiple of 64 x dp; `shard` = padded /
  // dp) holding `params`, and allocates the part this rank holds (none when padded is 0).
  void AddLayer(int64_t padded, int64_t shard, std::vector<FrozenParam> params);

  int64_t padded(size_t layer) const { return regions_[layer].padded; }
  // The part of layer l's region this rank holds: all of it, or at stage 3 its shard.
  const Buffer& held(size_t layer) const { return regions_[layer].held; }
  // A frozen parameter's view at `offset` in `region` (the held region, or a gathered one):
  // its values in the compute dtype, or for a quantized one its blob (U8). Undefined when the
  // region is absent (stage 3 before the gather).
  Tensor View(const Buffer& region, const nn::ParamSpec& spec, int64_t offset) const;
  // Stage 3: launches the all-gather of layer l's region into `whole` (padded(l) bytes).
  comm::WorkPtr LaunchGather(size_t layer, const Buffer& whole);
  // Writes this rank's part of layer l's region from `fill`: the parameters `only` accepts
  // (all without it), each rounded to the compute dtype or quantized from its whole value.
  // Not collective.
  void SetHeld(size_t layer, const FrozenFill& fill,
               const std::function<bool(const std::string&)>& only = {});
  // Layer l's whole region on the host (collective over dp at stage 3: every rank calls it).
  std::vector<uint8_t> Whole(size_t layer);
  // The fp32 value of the parameter at `offset` of a whole region from Whole(): widened, or
  // dequantized.
  std::vector<float> Values(const nn::ParamSpec& spec, int64_t offset,
                            const std::vector<uint8_t>& region) const;

 private:
  struct Region {
    int64_t padded = 0, shard = 0;
    Buffer held;
    std::vector<FrozenParam> params;
  };
  void SetHeldQuantized(const FrozenParam& p, int64_t lo, int64_t hi, const Tensor& dst,
                        const FrozenFill& fill);

  const Options options_;
  comm::Communicator& dp_;
  kernels::Ops& ops_;
  Allocator& staging_;
  Allocator& work_;
  const FrozenHooks hooks_;
  std::vector<Region> regions_;
};

}  // namespace ztrain::zero
