#include "offload/optimizer_swapper.h"

#include <algorithm>
#include <exception>

#include "core/error.h"

namespace ztrain::offload {
namespace {

int64_t HalfBytes(int64_t tile) { return AlignUp(tile * static_cast<int64_t>(sizeof(float))); }

// The tile of a swap file for these layers: the largest range's size at most.
int64_t TileSize(const std::vector<int64_t>& layer_elements, int64_t tile_elements) {
  int64_t largest = 0;
  for (int64_t n : layer_elements) largest = std::max(largest, n);
  return std::max<int64_t>(1, std::min(tile_elements, largest));
}

// A tile's record: m, then v at the next aligned offset.
int64_t RecordBytes(int64_t count) { return 2 * HalfBytes(count); }

}  // namespace

int64_t OptimizerSwapper::FileBytes(const std::vector<int64_t>& layer_elements,
                                    int64_t tile_elements) {
  const int64_t tile = TileSize(layer_elements, tile_elements);
  int64_t bytes = 0;
  for (int64_t n : layer_elements) {
    for (int64_t at = 0; at < n; at += tile) bytes += RecordBytes(std::min(tile, n - at));
  }
  return bytes;
}

OptimizerSwapper::OptimizerSwapper(IoEngine* io, const std::string& path,
                                   std::vector<int64_t> layer_elements,
                                   const OptimizerSwapOptions& options, Allocator& allocator)
    : tile_(TileSize(layer_elements, options.tile_elements)), options_(options) {
  ZTRAIN_CHECK(options.tile_elements > 0, "optimizer swap: tiles of ", options.tile_elements,
               " elements");
  for (int64_t n : layer_elements) {
    ZTRAIN_CHECK(n >= 0, "optimizer swap: a layer of ", n, " elements");
    layer_first_.push_back(tiles_.size());
    for (int64_t at = 0; at < n; at += tile_) {
      const int64_t count = std::min(tile_, n - at);
      const int64_t offset =
          tiles_.empty() ? 0 : tiles_.back().offset + RecordBytes(tiles_.back().count);
      tiles_.push_back({elements_ + at, count, offset});
    }
    elements_ += n;
  }
  layer_first_.push_back(tiles_.size());
  const bool shape_only = !allocator.holds_data();
  ZTRAIN_ASSERT(io != nullptr || shape_only, "an optimizer swapper needs an I/O engine");
  if (!shape_only) file_ = SwapFile::Create(*io, path, FileBytes(layer_elements, tile_));
  const int needed = 1 + (options.pipeline_read ? 1 : 0) + (options.pipeline_write ? 1 : 0);
  slots_.resize(static_cast<size_t>(std::max(needed, options.buffers)));
  for (Slot& s : slots_) {
    s.buffer = IoBuffer(allocator, RecordBytes(tile_));
    if (!shape_only) s.buffer.Register(*io);
  }
}

OptimizerSwapper::~OptimizerSwapper() {
  for (Slot& s : slots_) {
    if (!s.work) continue;
    try {
      s.work->Wait();
    } catch (const std::exception&) {
    }
  }
}

float* OptimizerSwapper::M(Slot& s) const { return reinterpret_cast<float*>(s.buffer.data()); }
float* OptimizerSwapper::V(Slot& s, const Tile& tile) const {
  return reinterpret_cast<float*>(s.buffer.data() + HalfBytes(tile.count));
}

OptimizerSwapper::Slot* OptimizerSwapper::Holding(size_t tile) {
  for (Slot& s : slots_) {
    if (s.tile == static_cast<int64_t>(tile)) return &s;
  }
  return nullptr;
}

void OptimizerSwapper::Finish(Slot& slot) {
  if (!slot.work) return;
  const IoWorkPtr work = std::move(slot.work);
  slot.work.reset();
  slot.writing = false;
  try {
    work->Wait();
  } catch (...) {
    slot.tile = -1;  // what it holds is not known to be anywhere
    throw;
  }
}

OptimizerSwapper::Slot* OptimizerSwapper::Take(const Slot* keep, bool wait) {
  auto usable = [&](const Slot& s) { return &s != keep; };
  for (Slot& s : slots_) {
    if (usable(s) && s.tile < 0 && !s.work) return &s;
  }
  Slot* idle = nullptr;  // the least recently used idle buffer
  for (Slot& s : slots_) {
    if (usable(s) && !s.work && (!idle || s.used < idle->used)) idle = &s;
  }
  if (idle) return idle;
  for (Slot& s : slots_) {
    if (usable(s) && s.writing && s.work->Done()) {
      Finish(s);
      return &s;
    }
  }
  if (!wait) return nullptr;
  Slot* oldest = nullptr;  // writing, or else reading ahead
  for (Slot& s : slots_) {
    if (!usable(s)) continue;
    if (!oldest || (s.writing && !oldest->writing) ||
        (s.writing == oldest->writing && s.used < oldest->used)) {
      oldest = &s;
    }
  }
  ZTRAIN_ASSERT(oldest != nullptr, "an optimizer swapper of one buffer reads ahead");
  Finish(*oldest);
  return oldest;
}

void OptimizerSwapper::StartRead(Slot& slot, size_t tile) {
  slot.tile = static_cast<int64_t>(tile);
  slot.used = ++clock_;
  slot.writing = false;
  const Tile& t = tiles_[tile];
  slot.work = file_->Read(t.offset, slot.buffer, RecordBytes(t.count));
}

void OptimizerSwapper::ForEachTile(const TileStep& step, bool save) {
  Walk(0, tiles_.size(), step, save);
}

void OptimizerSwapper::ForEachTileOf(size_t layer, const TileStep& step, bool save) {
  ZTRAIN_ASSERT(layer + 1 < layer_first_.size());
  Walk(layer_first_[layer], layer_first_[layer + 1], step, save);
}

void OptimizerSwapper::Prefetch(size_t layer) {
  if (!file_) return;
  ZTRAIN_ASSERT(layer + 1 < layer_first_.size());
  for (size_t t = layer_first_[layer]; t < layer_first_[layer + 1]; ++t) {
    if (Holding(t)) continue;
    Slot* s = Take(nullptr, /*wait=*/false);
    if (!s) return;
    StartRead(*s, t);
  }
}

void OptimizerSwapper::Walk(size_t first, size_t end, const TileStep& step, bool save) {
  if (!file_) {  // shape-only: the tiles without I/O
    for (size_t t = first; t < end; ++t) {
      Slot& s = slots_[t % slots_.size()];
      step(tiles_[t].begin, tiles_[t].count, M(s), V(s, tiles_[t]));
    }
    return;
  }
  Slot* current = nullptr;
  try {
    for (size_t t = first; t < end; ++t) {
      current = Holding(t);
      if (!current) {
        current = Take(nullptr, /*wait=*/true);
        StartRead(*current, t);
      }
      Finish(*current);  // its read, or a write: the caller may change the buffer
      current->used = ++clock_;
      if (options_.pipeline_read && t + 1 < end && !Holding(t + 1)) {
        StartRead(*Take(current, /*wait=*/true), t + 1);
      }
      const Tile& tile = tiles_[t];
      step(tile.begin, tile.count, M(*current), V(*current, tile));
      if (!save) {
        current->tile = -1;  // read only: dropped, so nothing step changed shows later
      } else {
        current->writing = true;
        current->work = file_->Write(tile.offset, current->buffer, RecordBytes(tile.count));
        if (!options_.pipeline_write) Finish(*current);
      }
      current = nullptr;
    }
  } catch (...) {
    // The tile the step was on may be half changed: dropped, so it is read again from the
    // file. Every transfer finishes before the exception leaves.
    if (current && !current->work) current->tile = -1;
    for (Slot& s : slots_) {
      try {
        Finish(s);
      } catch (const std::exception&) {
      }
    }
    throw;
  }
}

void OptimizerSwapper::Flush() {
  for (Slot& s : slots_) {
    if (s.writing) Finish(s);
  }
}

}  // namespace ztrain::offload
