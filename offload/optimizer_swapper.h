#pragma once
// OptimizerSwapper: a rank's Adam state (m and v) in a swap file, streamed through memory in
// tiles of `tile_elements` (offload_optimizer: {device: nvme}; the tile is
// zero_optimization.sub_group_size).
//
// The rank's optimizer elements are numbered 0..elements-1: the layers' optimizer ranges
// concatenated in order. Each layer's range splits into tiles of `tile_elements` (its last one
// shorter), so no tile crosses two layers; each tile is one record in the file, as long as the
// tile: m, then v at the next aligned offset. The file is preallocated with zeros, which is
// Adam's initial state.
//
// ForEachTile hands every tile's m and v to the caller in order, ForEachTileOf those of one
// layer (Note [Deferred optimizer step], engine/engine_optimizer.cc: a layer stepped on its
// own, as the next forward reads it). The tiles pass through `buffers` tile buffers, which
// also cache them:
//   - a buffer keeps its tile after the caller stepped it, so asking for the tile again reads
//     nothing (what the caller wrote is in it, and on its way to the file); after a walk that
//     does not save, the tile is read again from the file next time;
//   - with pipeline_read the next tile of the walk is read while the caller works on this one;
//     Prefetch(layer) starts reading a layer's first tiles into the buffers free at once;
//   - with pipeline_write a tile the caller changed is written while the walk goes on, and may
//     still be in flight when the walk returns (a later use of its buffer waits for it);
//     without it each write is waited for at once;
//   - a buffer is taken for another tile free ones first, then the least recently used idle
//     one, then one whose write is done or, waiting, the oldest writing one.
// At most one buffer holds a tile, so a read never races a write of the same tile. An I/O
// error throws IoError (naming file, offset and size); an exception from the caller's step
// leaves its tile's buffer dropped (the file keeps the tile as it was) after every transfer in
// flight finished. With a shape-only allocator (Allocator::holds_data false: the memory
// estimate, Note [Shape-only engine]) there is no file and the walks hand out the buffers
// without I/O; `io` may then be null.
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
  // Tile buffers; at least 1 + pipeline_read + pipeline_write are made.
  int buffers = 1;
};

class OptimizerSwapper {
 public:
  // `layer_elements[l]` is layer l's optimizer range (0: none).
  OptimizerSwapper(IoEngine* io, const std::string& path, std::vector<int64_t> layer_elements,
                   const OptimizerSwapOptions& options, Allocator& allocator);
  // Waits for the transfers in flight, reporting no error.
  ~OptimizerSwapper();
  OptimizerSwapper(const OptimizerSwapper&) = delete;
  OptimizerSwapper& operator=(const OptimizerSwapper&) = delete;

  // Bytes of the swap file for these sizes (for the up-front space check).
  static int64_t FileBytes(const std::vector<int64_t>& layer_elements, int64_t tile_elements);

  using TileStep = std::function<void(int64_t begin, int64_t count, float* m, float* v)>;
  // Calls step(begin, count, m, v) for every tile in order (begin: the tile's first element
  // in the rank's numbering); what step writes to m and v is saved back to the file, unless
  // `save` is false (reading only, e.g. for a checkpoint).
  void ForEachTile(const TileStep& step, bool save = true);
  // The same over layer l's tiles only.
  void ForEachTileOf(size_t layer, const TileStep& step, bool save = true);
  // Starts reading layer l's first tiles not held yet into the buffers free without waiting.
  void Prefetch(size_t layer);
  // Waits for every write in flight (and reports its error).
  void Flush();

  int64_t elements() const { return elements_; }
  int64_t tile_elements() const { return tile_; }
  int buffers() const { return static_cast<int>(slots_.size()); }

 private:
  struct Tile {
    int64_t begin, count;  // in the rank's numbering
    int64_t offset;        // of its record in the file
  };
  struct Slot {
    IoBuffer buffer;
    IoWorkPtr work;     // the read or write in flight
    int64_t tile = -1;  // the tile it holds or is reading (-1: none)
    bool writing = false;
    int64_t used = 0;  // when it was last handed out or filled (a counter)
  };
  void Walk(size_t first, size_t end, const TileStep& step, bool save);
  Slot* Holding(size_t tile);
  // A buffer for another tile; `keep` is not taken. With `wait` false, only one that needs
  // no waiting (null when none).
  Slot* Take(const Slot* keep, bool wait);
  void StartRead(Slot& slot, size_t tile);
  void Finish(Slot& slot);  // waits for its transfer
  float* M(Slot& s) const;
  float* V(Slot& s, const Tile& tile) const;

  int64_t elements_ = 0;
  int64_t tile_;
  OptimizerSwapOptions options_;
  std::vector<Tile> tiles_;
  std::vector<size_t> layer_first_;  // per layer: its first tile; one more entry at the end
  std::unique_ptr<SwapFile> file_;   // null: shape-only
  std::vector<Slot> slots_;
  int64_t clock_ = 0;
};

}  // namespace ztrain::offload
