#pragma once
// The pread/pwrite fallback: a pool of worker threads, each running one piece at a time with
// blocking system calls (a short transfer loops for the rest). Used where io_uring is not
// built or cannot be set up, or when IoOptions::force_fallback asks for it. queue_depth,
// single_submit and overlap_events do not apply: `threads` pieces are in flight at most.
#include <memory>
#include <string>

#include "offload/io/io_engine.h"

namespace ztrain::offload::detail {

// `why` says why io_uring is not used, e.g. "io_uring unavailable: EPERM ...".
std::unique_ptr<IoEngine> MakePosixEngine(const IoOptions& options, const std::string& why);

}  // namespace ztrain::offload::detail
