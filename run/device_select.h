#pragma once
// SelectDevice: the config's `device` setting resolved for one rank (Note [One rank per GPU]).
//
// Note [One rank per GPU]
// On CUDA every rank drives one GPU, the one numbered by its local rank (its place among the
// ranks of its node), and the ranks talk through NCCL, which refuses two ranks on one GPU.
// "cuda" insists on that and fails when the node has fewer GPUs than ranks; "auto" (the
// default) takes it when it can and otherwise trains on the CPU, saying why; "cuda:N" puts
// the rank on GPU N whatever its local rank: one rank per node, or a launcher that already
// gave each rank its own GPU (srun --gpus-per-task=1: each sees one, so "cuda:0").
//
// Pure except for the LaunchEnv overload, which asks the machine how many GPUs it sees.
// Errors are ConfigErrors that name the setting, what is missing and the fix.
#include <string>

#include "core/device.h"
#include "parallel/launch_env.h"

namespace ztrain {

struct DeviceChoice {
  Device device;
  std::string reason;  // for the start log: "local rank 1 of 2, 8 GPUs visible"
};

// `setting` is the config's device ("auto", "cpu", "cuda", "cuda:N"); the rank is
// `local_rank` of the `local_size` ranks on its node, which shows it `visible_gpus` GPUs.
DeviceChoice SelectDevice(const std::string& setting, int local_rank, int local_size,
                          int visible_gpus);
// As above for this process: the GPUs it sees (kernels::CudaDeviceCount(), 0 in a build
// without CUDA), and with several ranks on CUDA a build with NCCL ("auto" falls back to the
// CPU without one).
DeviceChoice SelectDevice(const std::string& setting, const LaunchEnv& env);
// As above with `visible_gpus` GPUs. A task that SLURM gave its own GPUs (srun
// --gpus-per-task=G: env.gpus_per_task is G and it sees exactly G) takes the first of them,
// whatever its local rank.
DeviceChoice SelectDevice(const std::string& setting, const LaunchEnv& env, int visible_gpus);

}  // namespace ztrain
