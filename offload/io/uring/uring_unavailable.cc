// The io_uring backend's entry point in a build without liburing.
#include "offload/io/uring/uring_engine.h"

namespace ztrain::offload::detail {

std::unique_ptr<IoEngine> MakeUringEngine(const IoOptions&, std::string* why_not) {
  *why_not =
      "io_uring not built: install liburing-dev and reconfigure with -DZTRAIN_WITH_IO_URING=ON";
  return nullptr;
}

}  // namespace ztrain::offload::detail
