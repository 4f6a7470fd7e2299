#include "run/device_select.h"

#include <optional>

#include "core/config.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "parallel/comm/nccl/nccl_communicator.h"

namespace ztrain {
namespace {

std::string Gpus(int n) { return detail::StrCat(n, n == 1 ? " GPU" : " GPUs"); }

std::string Where(int local_rank, int local_size, int visible_gpus) {
  return detail::StrCat("local rank ", local_rank, " of ", local_size, ", ", Gpus(visible_gpus),
                        " visible");
}

void CheckSomeGpu(const std::string& setting, int visible_gpus) {
  ZTRAIN_CHECK_T(ConfigError, visible_gpus > 0, "device is \"", setting,
                 "\" but no CUDA device is visible (no GPU or driver, CUDA_VISIBLE_DEVICES hides "
                 "them, or this build has no CUDA); use \"device\": \"cpu\", or \"auto\" to "
                 "train on a GPU only where there is one");
}

// "cuda:N": GPU N on every rank of the node.
DeviceChoice FixedGpu(const std::string& setting, int index, int local_rank, int local_size,
                      int visible_gpus) {
  CheckSomeGpu(setting, visible_gpus);
  ZTRAIN_CHECK_T(ConfigError, index < visible_gpus, "device is \"", setting, "\" but only ",
                 Gpus(visible_gpus), " visible (cuda:0 to cuda:", visible_gpus - 1,
                 "); use one of those, \"cuda\" for one GPU per local rank, or \"cpu\"");
  return {Device::Cuda(index),
          "set in the config; " + Where(local_rank, local_size, visible_gpus)};
}

// "cuda": one rank per GPU, fails on every rank of a node with too few.
DeviceChoice GpuOfLocalRank(const std::string& setting, int local_rank, int local_size,
                            int visible_gpus) {
  CheckSomeGpu(setting, visible_gpus);
  if (local_size > visible_gpus) {
    const int without = local_rank >= visible_gpus ? local_rank : local_size - 1;
    throw ConfigError(detail::StrCat(
        "one rank per GPU: local rank ", without, " has no GPU, ", visible_gpus,
        " visible for the ", local_size, " ranks on this node; launch at most ", visible_gpus,
        " ranks per node (mpirun --npernode ", visible_gpus, ", srun --ntasks-per-node=",
        visible_gpus, ")",
        visible_gpus == 1 ? ", use \"device\": \"cuda:0\" when the launcher gives each rank "
                            "its own GPU,"
                          : "",
        " or use \"device\": \"cpu\""));
  }
  return {Device::Cuda(local_rank), Where(local_rank, local_size, visible_gpus)};
}

// "auto": one rank per GPU when the node has a GPU for each rank, else the CPU.
DeviceChoice Auto(int local_rank, int local_size, int visible_gpus) {
  if (visible_gpus == 0) return {Device::Cpu(), "no CUDA device visible"};
  if (visible_gpus < local_size) {
    return {Device::Cpu(),
            detail::StrCat(local_size, " ranks on this node but ", Gpus(visible_gpus),
                           ": running on the CPU; set \"device\": \"cuda\" to fail instead")};
  }
  return {Device::Cuda(local_rank), Where(local_rank, local_size, visible_gpus)};
}

}  // namespace

DeviceChoice SelectDevice(const std::string& setting, int local_rank, int local_size,
                          int visible_gpus) {
  const std::optional<DeviceSetting> s = ParseDeviceSetting(setting);
  ZTRAIN_CHECK_T(ConfigError, s.has_value(), "device: expected ", kDeviceSettings, ", got \"",
                 setting, "\"");
  ZTRAIN_ASSERT(0 <= local_rank && local_rank < local_size && visible_gpus >= 0, "local rank ",
                local_rank, " of ", local_size, ", ", visible_gpus, " GPUs");
  switch (s->kind) {
    case DeviceSetting::Kind::kCpu:
      return {Device::Cpu(), "set in the config"};
    case DeviceSetting::Kind::kCuda:
      return s->index >= 0 ? FixedGpu(setting, s->index, local_rank, local_size, visible_gpus)
                           : GpuOfLocalRank(setting, local_rank, local_size, visible_gpus);
    case DeviceSetting::Kind::kAuto:
      break;
  }
  return Auto(local_rank, local_size, visible_gpus);
}

DeviceChoice SelectDevice(const std::string& setting, const LaunchEnv& env) {
  return SelectDevice(setting, env, kernels::CudaDeviceCount());
}

DeviceChoice SelectDevice(const std::string& setting, const LaunchEnv& env, int visible) {
  // srun --gpus-per-task gives each task its own GPUs (CUDA_VISIBLE_DEVICES lists only
  // them): the task is alone on what it sees, whatever its local rank.
  const bool own_gpus = env.gpus_per_task > 0 && visible == env.gpus_per_task;
  DeviceChoice choice = own_gpus ? SelectDevice(setting, 0, 1, visible)
                                 : SelectDevice(setting, env.local_rank, env.local_size, visible);
  if (own_gpus && !choice.device.is_cpu()) {
    choice.reason = detail::StrCat("srun --gpus-per-task=", env.gpus_per_task,
                                   ": this task's own GPU (local rank ", env.local_rank, " of ",
                                   env.local_size, ")");
  }
  if (choice.device.is_cpu() || env.world_size == 1 || comm::HaveNccl()) return choice;
  // Ranks on CUDA talk through NCCL only.
  ZTRAIN_CHECK_T(ConfigError, setting == "auto", "device is \"", setting, "\" with ",
                 env.world_size, " ranks, but this build has no NCCL to connect them; "
                 "reconfigure with -DZTRAIN_WITH_NCCL=ON or use \"device\": \"cpu\"");
  return {Device::Cpu(), detail::StrCat("this build has no NCCL to connect ", env.world_size,
                                        " ranks on CUDA")};
}

}  // namespace ztrain
