// Note [Activation checkpointing in the engine] is in activation_checkpointing.h.
#include "engine/activation_checkpointing.h"

#include <algorithm>
#include <utility>

#include "core/logging.h"

namespace ztrain {

ActivationCheckpointing::Options ActivationCheckpointing::OptionsFor(
    const ActivationCheckpointingConfig& config, const std::vector<int>& block_of_layer,
    bool on_device, int tp_size) {
  Options o;
  o.checkpointed.assign(block_of_layer.size(), false);
  if (!config.enabled) return o;
  for (size_t i = 0; i < block_of_layer.size(); ++i) {
    const int block = block_of_layer[i];
    o.checkpointed[i] = block >= 0 && std::find(config.blocks.begin(), config.blocks.end(),
                                                block) != config.blocks.end();
  }
  o.offload_inputs = config.cpu_checkpointing && on_device;
  o.partition_inputs = config.partition_activations && tp_size > 1;
  return o;
}

ActivationCheckpointing::ActivationCheckpointing(Options options, comm::Communicator& tp,
                                                 kernels::Ops& ops, Allocator& activations,
                                                 Allocator* host,
                                                 std::function<void(comm::Work&)> wait)
    : options_(std::move(options)),
      tp_(tp),
      ops_(ops),
      activations_(activations),
      host_(host),
      wait_(std::move(wait)) {
  ZTRAIN_ASSERT(!options_.offload_inputs || host_ != nullptr, "no host memory for the inputs");
}

std::string ActivationCheckpointing::Describe(const ActivationCheckpointingConfig& config,
                                              bool on_device) const {
  const auto count = std::count(options_.checkpointed.begin(), options_.checkpointed.end(), true);
  const std::string where = !config.cpu_checkpointing ? ""
                            : on_device
                                ? "; their inputs wait in host memory"
                                : "; cpu_checkpointing: activations are host memory on the CPU "
                                  "backend already";
  const std::string parts =
      options_.partition_inputs
          ? fmt::format("; their inputs partitioned over the {} tensor-parallel ranks", tp_.size())
          : "";
  return fmt::format(
      "activation checkpointing: {} of this stage's layers rerun their forward in backward{}{}",
      count, where, parts);
}

void ActivationCheckpointing::KeepInput(const Tensor& input, Buffer& owner, Buffer& kept) {
  if (options_.partition_inputs) {  // this rank's 1/tp of it, the last part zero-padded
    const int64_t n = input.numel(), t = tp_.size(), chunk = (n + t - 1) / t;
    const int64_t begin = std::min(n, tp_.rank() * chunk), count = std::min(chunk, n - begin);
    kept = Buffer(activations_, input.dtype(), {chunk}, MemoryCategory::kActivations);
    ops_.Zero(kept.AsTensor(input.dtype(), {chunk}));
    ops_.Copy(input.Flat(begin, {count}), kept.AsTensor(input.dtype(), {count}));
  } else {
    kept = Buffer(*host_, input.dtype(), input.shape(), MemoryCategory::kActivations);
    ops_.Copy(input, kept.AsTensor(input.dtype(), input.shape()));
  }
  ops_.Synchronize();  // before the buffer goes back to the pool
  owner.Reset();
}

Tensor ActivationCheckpointing::RestoreInput(Buffer& kept, const Tensor& input, Buffer& owner) {
  if (options_.partition_inputs) {
    const auto chunk = static_cast<int64_t>(kept.nbytes() / DTypeSize(input.dtype()));
    const int64_t t = tp_.size();
    owner = Buffer(activations_, input.dtype(), {chunk * t}, MemoryCategory::kActivations);
    wait_(*tp_.AllGather(kept.AsTensor(input.dtype(), {chunk}),
                         owner.AsTensor(input.dtype(), {chunk * t})));
  } else {
    owner = Buffer(activations_, input.dtype(), input.shape(), MemoryCategory::kActivations);
    ops_.Copy(kept.AsTensor(input.dtype(), input.shape()),
              owner.AsTensor(input.dtype(), input.shape()));
    ops_.Synchronize();
  }
  kept.Reset();
  return owner.AsTensor(input.dtype(), input.shape());
}

void ActivationCheckpointing::Recompute(nn::Layer& layer, const nn::MicroBatch& mb,
                                        const Tensor& input, const Tensor& out,
                                        nn::LayerContext& ctx) {
  Buffer scratch(activations_, out.dtype(), out.shape(), MemoryCategory::kActivations);
  layer.Forward(mb, input, scratch.AsTensor(out.dtype(), out.shape()), ctx);
}

}  // namespace ztrain
