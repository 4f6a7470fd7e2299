#pragma once
// ParamSwapper: a rank's ZeRO stage 3 parameter shards (one per layer) in a swap file
// (offload_param: {device: nvme}).
//
// Layers in model order stay in memory while their shards add up to at most `max_in_cpu`
// elements (DeepSpeed's max_in_cpu); the rest live in the file, one aligned record per layer,
// and pass through `buffer_count` swap buffers of `buffer_elements` each (DeepSpeed's
// buffer_count / buffer_size): Prefetch starts reading a layer's shard into a free buffer so
// the read runs while earlier layers compute; CopyOut hands the shard over (waiting for its
// read, or reading it now) and frees the buffer; Store copies an updated shard into a buffer
// and writes it back in the background; Acquire and Release let the caller update a shard in
// its buffer and write it back from there. A buffer whose write is in flight is reused only
// after the write finished, and a read of a layer waits for that layer's pending write, so
// a read never returns stale data. I/O errors throw IoError (naming file, offset and size).
// The in-memory shards come from `allocator`, the swap buffers from `buffer_allocator`
// (pinned host memory in the engine). With shape-only allocators (Allocator::holds_data
// false: the memory estimate, Note [Shape-only engine]) the swapper makes its buffers, and no
// file, and moves no bytes; `io` may then be null.
// Not thread safe.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/buffer.h"
#include "offload/io/io_buffer.h"
#include "offload/io/io_engine.h"
#include "offload/io/swap_file.h"

namespace ztrain::offload {

struct ParamSwapOptions {
  int buffer_count = 5;
  int64_t buffer_elements = 100000000;
  int64_t max_in_cpu = 1000000000;
};

class ParamSwapper {
 public:
  // `shard_elements[l]` is layer l's shard size. A shard that must live in the file but is
  // larger than a buffer is a ConfigError naming the size buffer_size needs.
  ParamSwapper(IoEngine* io, const std::string& path, std::vector<int64_t> shard_elements,
               const ParamSwapOptions& options, Allocator& allocator, Allocator& buffer_allocator);
  ~ParamSwapper();
  ParamSwapper(const ParamSwapper&) = delete;
  ParamSwapper& operator=(const ParamSwapper&) = delete;

  // Bytes of the swap file for these sizes and options (for the up-front space check).
  static int64_t FileBytes(const std::vector<int64_t>& shard_elements, int64_t max_in_cpu);

  void Prefetch(size_t layer);
  void CopyOut(size_t layer, float* out);
  void Store(size_t layer, const float* in);
  // Layer l's shard where the swapper holds it (its in-memory shard, or a swap buffer it is
  // read into, now unless read ahead), for the caller to read and change in place until
  // Release(l, changed); with `changed` it is written back from there, and a CopyOut of the
  // layer meanwhile copies it from that buffer without waiting for the write. One layer at a
  // time; null with shape-only allocators.
  float* Acquire(size_t layer);
  void Release(size_t layer, bool changed);
  // Waits for every write in flight (and reports its error).
  void Flush();

  bool resident(size_t layer) const { return offsets_[layer] < 0; }
  int64_t resident_elements() const { return resident_elements_; }

 private:
  struct Slot {
    IoBuffer buffer;
    IoWorkPtr work;        // the read or write in flight
    int64_t layer = -1;    // the layer being read into it (-1: none)
    bool writing = false;
    bool held = false;     // handed out by Acquire
    int64_t issued = 0;    // when its transfer was issued (a counter)
  };
  int64_t Bytes(size_t layer) const {
    return shard_elements_[layer] * static_cast<int64_t>(sizeof(float));
  }
  Slot* FindReading(size_t layer);
  Slot& ReadInto(size_t layer);  // a buffer holding the layer's shard, read now unless ahead
  Slot& FreeSlot();  // waits for a write or drops the latest read-ahead when none is free
  void Finish(Slot& slot);
  void WaitForWritesOf(size_t layer);

  std::vector<int64_t> shard_elements_;
  std::vector<int64_t> offsets_;  // file offset per layer; -1: kept in memory
  std::vector<Buffer> resident_;  // the in-memory shards
  std::vector<Slot> slots_;
  std::vector<int64_t> last_write_slot_;  // per layer: the slot of its latest write, or -1
  int64_t resident_elements_ = 0;
  int64_t issued_ = 0;
  bool shape_only_ = false;
  std::unique_ptr<SwapFile> file_;
};

}  // namespace ztrain::offload
