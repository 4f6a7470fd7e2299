#pragma once
// Note [State placement]
// Where each kind of a rank's model state lives, decided once from zero_optimization and the
// device the engine computes on; the engine's storage, its swappers and swap directories, and
// the trainer's log all ask here (Note [Offload in the engine], engine/engine_state.h):
//   params       the fp32 parameters the rank holds (at stage 3 its shards): device memory;
//                at stage 3 with offload_param cpu host memory (pinned with pin_memory), with
//                offload_param nvme the swap file. Below stage 3 offload_param is ignored, as
//                DeepSpeed ignores it.
//   frozen       the frozen regions (Note [Frozen regions]): where params
//                are, but host memory where those are on NVMe (frozen shards are not swapped).
//   optimizer    Adam's m and v: device memory unless AdamW runs on the host, then host
//                memory (pinned with offload_optimizer cpu and pin_memory), or with
//                offload_optimizer nvme the swap file.
//   host_adam    AdamW runs on the host: always on the CPU backend; on a device when the
//                optimizer state or the parameters are offloaded (ZeRO-Offload).
//   host_master  on a device with AdamW on the host and the parameters in device memory: the
//                fp32 master of the optimizer range is kept in pinned host memory too.
// On the CPU backend "device memory" is host memory counted as the device's.
#include <cstdint>
#include <string>

#include "core/config.h"

namespace ztrain::offload {

enum class Place { kDevice, kHost, kPinned, kNvme };

struct Placement {
  Place params = Place::kDevice;
  Place optimizer = Place::kDevice;
  bool host_adam = false;
  bool host_master = false;
  bool params_offloaded() const { return params != Place::kDevice; }
  // The parameters in host memory, pinned or not (offload_param cpu).
  bool params_in_host() const { return params == Place::kHost || params == Place::kPinned; }
  Place frozen() const { return params == Place::kNvme ? Place::kHost : params; }
};

// `on_device`: the engine computes on a GPU (false: the CPU backend).
Placement PlaceState(const ZeroConfig& zero, bool on_device);

const char* PlaceName(Place place);  // "device", "host", "pinned host", "NVMe"

// The log line for state offloaded to host memory ("" when none is): what is there, and how
// much of it is pinned (`pinned` bytes locked, `unpinned` bytes pin_memory asked for that
// RLIMIT_MEMLOCK refused, with the fix).
std::string DescribeHostOffload(const Placement& at, const ZeroConfig& zero, int64_t pinned,
                                int64_t unpinned);

}  // namespace ztrain::offload
