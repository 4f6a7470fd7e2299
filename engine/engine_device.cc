// The engine on a device: which device, where each kind of state lives, and the copies
// between the host and the device.
//
// Note [Devices in the engine]
// The engine computes on one device, config.device: the CPU, or one CUDA GPU (the Trainer
// picks the GPU by local rank, run/device_select.h). On CUDA:
// - the ops are CudaOps, on their own (blocking) stream, so NCCL collectives, which order
//   themselves after the legacy default stream, see every op issued before them;
// - parameters, gradients, Adam's m and v and activations live in device memory
//   (cudaMallocAsync; activations through the caching allocator), and AdamW runs on the
//   device (optim::AdamStep on device tensors, fp32);
// - with offload_optimizer (or offload_param) AdamW runs on the host, as ZeRO-Offload does: m
//   and v live in host memory (or NVMe), the fp32 master of the rank's optimizer range in pinned
//   host memory (the parameter store's master; at stage 3 with offloaded parameters the host
//   shard is itself the master), and each step copies the reduced gradient range to pinned host
//   memory (`grad_host`), steps on the host, and copies each layer's updated range back to the
//   device as soon as the host has stepped it, so the copy of one layer runs while the host
//   steps the next. Offloaded stage-3 parameter shards are copied into their own chunk of the
//   gathered buffer beside the ops, and all-gathered in place, as with NVMe on the CPU (Note
//   [Offloaded shards beside compute], parallel/zero/param_gatherer.h);
// - the groups are NCCL communicators; scalars (loss, norm) cross them through device memory;
// - micro-batches arrive in host memory and are copied in; losses come back to the host;
//   whole-parameter values, initialisation and checkpoints go through host copies (the
//   parameter store's Read, Write and OpenOnHost, offload/param_store.h).
// Tensor parallelism runs on either: its split layers are ops of the op set, its all-reduces
// on the tp group's communicator (parallel/tensor/).
// On the CPU every "copy" is host memory to host memory and every buffer is host memory, so
// the CPU backend runs exactly the arithmetic it ran before devices existed.
#include <algorithm>
#include <cstring>
#include <optional>

#include "core/logging.h"
#include "engine/engine_impl.h"
#include "engine/engine_state.h"
#include "kernels/cuda_memory.h"

namespace ztrain {

Device EngineImpl::ResolveDevice(const std::string& setting) {
  const std::optional<DeviceSetting> parsed = ParseDeviceSetting(setting);
  ZTRAIN_CHECK_T(ConfigError, parsed.has_value(), "device is \"", setting, "\"; use ",
                 kDeviceSettings);
  switch (parsed->kind) {
    case DeviceSetting::Kind::kCpu:
      return Device::Cpu();
    case DeviceSetting::Kind::kAuto:
      return kernels::CudaDeviceCount() > 0 ? Device::Cuda(0) : Device::Cpu();
    case DeviceSetting::Kind::kCuda:
      break;
  }
  return Device::Cuda(std::max(parsed->index, 0));
}

void EngineImpl::CopyIn(const float* host, const Tensor& dst) {
  ops_->Copy(Tensor(const_cast<float*>(host), DType::kF32, dst.shape()), dst);
}

void EngineImpl::CopyOut(const Tensor& src, float* host) {
  ops_->Copy(src, Tensor(host, DType::kF32, src.shape()));
}

std::vector<float> EngineImpl::ToHost(const Tensor& t) {
  if (!computes_) return {0.0f};  // a shape-only tensor has no values: one zero stands for them
  std::vector<float> out(static_cast<size_t>(t.numel()));
  CopyOut(t, out.data());
  ops_->Synchronize();
  return out;
}

EngineImpl::StagedBatches EngineImpl::StageBatches(std::span<const nn::MicroBatch> micro_batches) {
  StagedBatches staged;
  staged.batches.assign(micro_batches.begin(), micro_batches.end());
  if (!on_device()) return staged;
  // A copy from pageable host memory returns once the source has been read: the caller's
  // token arrays may change as soon as this returns.
  for (nn::MicroBatch& mb : staged.batches) {
    for (Tensor* t : {&mb.tokens, &mb.targets, &mb.positions, &mb.whole_positions}) {
      if (!t->defined()) continue;
      Buffer& b = staged.buffers.emplace_back(memory_.activations(), DType::kI32, t->shape(),
                                              MemoryCategory::kActivations);
      const Tensor dst = b.AsTensor(DType::kI32, t->shape());
      ops_->Copy(*t, dst);
      *t = dst;
    }
  }
  return staged;
}

float EngineImpl::AllReduceScalar(comm::Communicator& group, float value, comm::ReduceOp op) {
  if (group.size() == 1) return value;
  if (!on_device()) {
    group.AllReduce(Tensor(&value, DType::kF32, {1}), op)->Wait();
    return value;
  }
  Buffer b(memory_.activations(), DType::kF32, {1}, MemoryCategory::kCommunication);
  const Tensor t = b.AsTensor(DType::kF32, {1});
  CopyIn(&value, t);
  group.AllReduce(t, op)->Wait();
  return ToHost(t)[0];
}

}  // namespace ztrain
