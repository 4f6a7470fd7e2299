#pragma once
// The io_uring backend: one ring owned by one worker thread (liburing stays inside
// offload/io/uring/uring_engine.cc). Built only with ZTRAIN_WITH_IO_URING; elsewhere
// uring_unavailable.cc answers that it is not built.
#include <memory>
#include <string>

#include "offload/io/io_engine.h"

namespace ztrain::offload::detail {

// An io_uring engine, or null with `why_not` saying why none can be had here
// ("io_uring unavailable: Operation not permitted (EPERM)", "io_uring not built: ...").
std::unique_ptr<IoEngine> MakeUringEngine(const IoOptions& options, std::string* why_not);

}  // namespace ztrain::offload::detail
