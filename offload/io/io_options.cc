#include "offload/io/io_options.h"

#include "core/config.h"

namespace ztrain::offload {

IoOptions IoOptionsFrom(const AioConfig& aio) {
  IoOptions o;
  o.block_size = aio.block_size;
  o.queue_depth = static_cast<int>(aio.queue_depth);
  o.threads = static_cast<int>(aio.intra_op_parallelism);
  o.single_submit = aio.single_submit;
  o.overlap_events = aio.overlap_events;
  return o;
}

}  // namespace ztrain::offload
