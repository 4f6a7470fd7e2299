#include "offload/io/io_engine.h"

#include <atomic>

#include "core/config.h"
#include "core/error.h"
#include "core/logging.h"
#include "offload/io/posix/posix_engine.h"
#include "offload/io/uring/uring_engine.h"

namespace ztrain::offload {
namespace {

using ::ztrain::detail::StrCat;

void CheckOptions(const IoOptions& o) {
  static_assert(kIoAlignment == kAioAlignment);
  ZTRAIN_CHECK(
      o.block_size > 0 && o.block_size % kIoAlignment == 0 && o.block_size <= kAioMaxBlockSize,
      "aio.block_size must be a multiple of ", kIoAlignment, " bytes (O_DIRECT) between ",
      kIoAlignment, " and 1 GiB, got ", o.block_size, " (DeepSpeed's default is 1048576)");
  ZTRAIN_CHECK(o.queue_depth >= 1 && o.queue_depth <= kAioMaxQueueDepth,
               "aio.queue_depth must be in [1, ", kAioMaxQueueDepth, "], got ", o.queue_depth);
  ZTRAIN_CHECK(o.threads >= 1 && o.threads <= kAioMaxThreads,
               "aio.intra_op_parallelism (or thread_count) must be in [1, ", kAioMaxThreads,
               "], got ", o.threads);
}

// Why the fallback runs is said once per process, not once per engine (tests and the
// swappers make several): a fallback forced by option at info, an unavailable io_uring as a
// warning.
void SayOnce(bool forced, const std::string& why, int threads) {
  static std::atomic<bool> said_forced{false};
  static std::atomic<bool> said_unavailable{false};
  if ((forced ? said_forced : said_unavailable).exchange(true)) return;
  const std::string what = StrCat("offload I/O: ", why, "; using a pread/pwrite pool of ", threads,
                                  threads == 1 ? " thread" : " threads");
  if (forced) {
    Log().info("{}", what);
  } else {
    Log().warn("{}", what);
  }
}

}  // namespace

std::unique_ptr<IoEngine> IoEngine::Make(const IoOptions& options) {
  CheckOptions(options);
  if (options.force_fallback) {
    const std::string why = "io_uring disabled by option";
    SayOnce(true, why, options.threads);
    return detail::MakePosixEngine(options, why);
  }
  std::string why;
  if (std::unique_ptr<IoEngine> engine = detail::MakeUringEngine(options, &why)) return engine;
  SayOnce(false, why, options.threads);
  return detail::MakePosixEngine(options, why);
}

IoStats IoEngine::stats() const {
  IoStats s;
  s.requests = counters_.requests.load();
  s.pieces = counters_.pieces.load();
  s.resubmits = counters_.resubmits.load();
  s.failures = counters_.failures.load();
  s.bytes_read = counters_.bytes_read.load();
  s.bytes_written = counters_.bytes_written.load();
  s.fixed_pieces = counters_.fixed_pieces.load();
  return s;
}

}  // namespace ztrain::offload
