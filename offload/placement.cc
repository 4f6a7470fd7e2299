// Note [State placement] (placement.h).
#include "offload/placement.h"

#include "core/logging.h"
#include "core/memory_tracker.h"

namespace ztrain::offload {
namespace {

Place OffloadPlace(const std::string& device, bool pin_memory) {
  if (device == "nvme") return Place::kNvme;
  return pin_memory ? Place::kPinned : Place::kHost;
}

}  // namespace

Placement PlaceState(const ZeroConfig& zero, bool on_device) {
  const OffloadParamConfig& op = zero.offload_param;
  const OffloadOptimizerConfig& oo = zero.offload_optimizer;
  Placement p;
  if (zero.stage == 3 && op.device != "none") p.params = OffloadPlace(op.device, op.pin_memory);
  p.host_adam = !on_device || oo.device != "none" || p.params_offloaded();
  if (oo.device != "none") {
    p.optimizer = OffloadPlace(oo.device, oo.pin_memory);
  } else if (p.host_adam) {
    p.optimizer = Place::kHost;
  }
  p.host_master = on_device && p.host_adam && !p.params_offloaded();
  return p;
}

const char* PlaceName(Place place) {
  switch (place) {
    case Place::kDevice:
      return "device";
    case Place::kHost:
      return "host";
    case Place::kPinned:
      return "pinned host";
    case Place::kNvme:
      return "NVMe";
  }
  return "?";
}

std::string DescribeHostOffload(const Placement& at, const ZeroConfig& zero, int64_t pinned,
                                int64_t unpinned) {
  const bool param_host = at.params_in_host();
  const bool opt_host = zero.offload_optimizer.device == "cpu";
  if (!param_host && !opt_host) return "";
  return fmt::format(
      "offload: {}{}{} in host memory{}", opt_host ? "optimizer state" : "",
      param_host && opt_host ? " and " : "", param_host ? "parameter shards" : "",
      pinned + unpinned == 0
          ? " (pin_memory off)"
          : fmt::format(", {} pinned{}", FormatBytes(pinned),
                        unpinned == 0
                            ? ""
                            : fmt::format(", {} not (RLIMIT_MEMLOCK too small: raise `ulimit -l`)",
                                          FormatBytes(unpinned))));
}

}  // namespace ztrain::offload
