#include "offload/optimizer_swapper.h"

#include <algorithm>
#include <exception>

#include "core/error.h"

namespace ztrain::offload {
namespace {
int64_t HalfBytes(int64_t tile) { return AlignUp(tile * static_cast<int64_t>(sizeof(float))); }
}  // namespace

int64_t OptimizerSwapper::FileBytes(int64_t elements, int64_t tile_elements) {
  const int64_t tile = std::max<int64_t>(1, std::min(tile_elements, elements));
  const int64_t tiles = (elements + tile - 1) / tile;
  return tiles * 2 * HalfBytes(tile);
}

OptimizerSwapper::OptimizerSwapper(IoEngine* io, const std::string& path, int64_t elements,
                                   const OptimizerSwapOptions& options, Allocator& allocator)
    : elements_(elements),
      tile_(std::max<int64_t>(1, std::min(options.tile_elements, elements))),
      options_(options) {
  ZTRAIN_CHECK(elements >= 0 && options.tile_elements > 0, "optimizer swap: bad sizes (", elements,
               " elements in tiles of ", options.tile_elements, ")");
  const bool shape_only = !allocator.holds_data();
  ZTRAIN_ASSERT(io != nullptr || shape_only, "an optimizer swapper needs an I/O engine");
  if (!shape_only) file_ = SwapFile::Create(*io, path, FileBytes(elements, tile_));
  const int n = 1 + (options.pipeline_read ? 1 : 0) + (options.pipeline_write ? 1 : 0);
  for (int i = 0; i < n; ++i) {
    buffers_.emplace_back(allocator, RecordBytes());
    if (!shape_only) buffers_.back().Register(*io);
  }
}

OptimizerSwapper::~OptimizerSwapper() = default;

int64_t OptimizerSwapper::RecordBytes() const { return 2 * HalfBytes(tile_); }

void OptimizerSwapper::ForEachTile(
    const std::function<void(int64_t begin, int64_t count, float* m, float* v)>& step, bool save) {
  const int64_t tiles = TileCount();
  const int64_t n_buf = static_cast<int64_t>(buffers_.size());
  const int64_t record = RecordBytes();
  std::vector<IoWorkPtr> reads(n_buf), writes(n_buf);  // in flight, by buffer
  auto count_of = [&](int64_t t) { return std::min(tile_, elements_ - t * tile_); };
  auto m_of = [&](int64_t b) { return reinterpret_cast<float*>(buffers_[b].data()); };
  auto v_of = [&](int64_t b) {
    return reinterpret_cast<float*>(buffers_[b].data() + HalfBytes(tile_));
  };
  if (!file_) {  // shape-only: the tiles without I/O
    for (int64_t t = 0; t < tiles; ++t)
      step(t * tile_, count_of(t), m_of(t % n_buf), v_of(t % n_buf));
    return;
  }
  auto start_read = [&](int64_t t) {
    const int64_t b = t % n_buf;
    if (writes[b]) {  // the buffer's last tile must be on disk before it is reused
      writes[b]->Wait();
      writes[b].reset();
    }
    reads[b] = file_->Read(t * record, buffers_[b], record);
  };
  try {
    if (tiles > 0) start_read(0);
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t b = t % n_buf;
      if (!reads[b]) start_read(t);  // not read ahead
      reads[b]->Wait();
      reads[b].reset();
      if (options_.pipeline_read && t + 1 < tiles) start_read(t + 1);
      step(t * tile_, count_of(t), m_of(b), v_of(b));
      if (!save) continue;
      writes[b] = file_->Write(t * record, buffers_[b], record);
      if (!options_.pipeline_write) {
        writes[b]->Wait();
        writes[b].reset();
      }
    }
    for (auto& w : writes) {
      if (w) w->Wait();
      w.reset();
    }
  } catch (...) {
    // Let every transfer finish before the exception leaves (the buffers stay valid anyway,
    // but a later step must not race a write still in flight).
    for (auto* works : {&reads, &writes}) {
      for (auto& w : *works) {
        if (!w) continue;
        try {
          w->Wait();
        } catch (const std::exception&) {
        }
        w.reset();
      }
    }
    throw;
  }
}

}  // namespace ztrain::offload
