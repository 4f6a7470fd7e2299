#pragma once
// IoOptions: how the offload file I/O engine runs, from DeepSpeed's `aio` section.
//
// The `aio` keys keep DeepSpeed's meaning where ztrain's engine has the same knob
// (docs/architecture.md "Offload I/O"): block_size cuts a request into pieces, queue_depth
// bounds the pieces in flight on the io_uring ring, intra_op_parallelism (older name:
// thread_count) sizes the pread/pwrite fallback pool, single_submit and overlap_events choose
// how the ring is fed.
#include <cstdint>

namespace ztrain {
struct AioConfig;
}

namespace ztrain::offload {

// File offsets, transfer lengths and buffer addresses of every I/O are multiples of this:
// O_DIRECT needs the logical block size (512 or 4096 on NVMe); 4096 suits both.
inline constexpr int64_t kIoAlignment = 4096;

inline constexpr int64_t AlignUp(int64_t bytes) {
  return (bytes + kIoAlignment - 1) / kIoAlignment * kIoAlignment;
}

struct IoOptions {
  int64_t block_size = 1 << 20;  // bytes per request piece; a multiple of kIoAlignment
  int queue_depth = 8;           // pieces in flight on the io_uring ring
  int threads = 1;               // threads of the pread/pwrite fallback pool
  bool single_submit = false;    // io_uring: one submit call per piece instead of batches
  bool overlap_events = true;    // io_uring: refill the ring as pieces complete; false waits
                                 // for each batch of queue_depth pieces to drain
  bool force_fallback = false;   // skip io_uring (tests, or a kernel that misbehaves)
  bool direct = true;            // O_DIRECT where the file system allows it
};

// The options of the `aio` section: intra_op_parallelism becomes `threads` (the config parser
// has already put a given thread_count there when intra_op_parallelism was not given).
IoOptions IoOptionsFrom(const AioConfig& aio);

}  // namespace ztrain::offload
