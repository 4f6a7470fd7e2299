// Note [State placement] (placement.h).
#include "offload/placement.h"

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

}  // namespace ztrain::offload
