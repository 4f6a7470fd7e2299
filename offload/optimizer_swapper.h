#pragma once
// OptimizerSwapper: a rank's Adam state (m and v) in a swap file, streamed through memory in
// tiles of `tile_elements` during the optimizer step (offload_optimizer: {device: nvme};
// the tile is zero_optimization.sub_group_size).
//
// The rank's optimizer elements are numbered 0..elements-1 (the engine concatenates its
// layers' optimizer ranges). Tile t covers [t * tile, min((t + 1) * tile, elements)) and is
// one record in the file: m, then v at the next aligned offset. The file is preallocated
// with zeros, which is Adam's initial state. ForEachTile hands each tile's m and v to the
// caller in order; with pipeline_read the next tile is read while the caller works on this
// one, with pipeline_write the previous tile is written meanwhile — DeepSpeed's
// pipeline_read / pipeline_write — so 1 + pipeline_read + pipeline_write tile buffers exist.
// Without them each read and write is waited for at once. An I/O error throws IoError from
// ForEachTile after every transfer it started has finished, so no buffer is freed under I/O.
// With a shape-only allocator (Allocator::holds_data false: the memory estimate, Note
// [Shape-only engine]) there is no file and ForEachTile hands out the buffers without I/O;
// `io` may then be null.
// Not thread safe.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "offload/io/io_buffer.h"
#include "offload/io/io_engine.h"
#include "offload/io/swap_file.h"

namespace ztrain::offload {

struct OptimizerSwapOptions {
  int64_t tile_elements = 1000000000;
  bool pipeline_read = false;
  bool pipeline_write = false;
};

class OptimizerSwapper {
 public:
  OptimizerSwapper(IoEngine* io, const std::string& path, int64_t elements,
                   const OptimizerSwapOptions& options, Allocator& allocator);
  ~OptimizerSwapper();
  OptimizerSwapper(const OptimizerSwapper&) = delete;
  OptimizerSwapper& operator=(const OptimizerSwapper&) = delete;

  // Bytes of the swap file for these sizes (for the up-front space check).
  static int64_t FileBytes(int64_t elements, int64_t tile_elements);

  // Calls step(begin, count, m, v) for every tile in order; what step writes to m and v is
  // saved back to the file, unless `save` is false (reading only, e.g. for a checkpoint).
  void ForEachTile(const std::function<void(int64_t begin, int64_t count, float* m, float* v)>& step,
                   bool save = true);

  int64_t elements() const { return elements_; }
  int64_t tile_elements() const { return tile_; }
  int buffers() const { return static_cast<int>(buffers_.size()); }

 private:
  int64_t TileCount() const { return (elements_ + tile_ - 1) / tile_; }
  int64_t RecordBytes() const;

  int64_t elements_;
  int64_t tile_;
  OptimizerSwapOptions options_;
  std::unique_ptr<SwapFile> file_;  // null: shape-only
  std::vector<IoBuffer> buffers_;
};

}  // namespace ztrain::offload
