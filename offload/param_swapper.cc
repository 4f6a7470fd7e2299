#include "offload/param_swapper.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include "core/error.h"

namespace ztrain::offload {
namespace {

// Which layers stay in memory: those, in model order, while the running total fits.
std::vector<bool> ResidentLayers(const std::vector<int64_t>& shards, int64_t max_in_cpu) {
  std::vector<bool> resident(shards.size(), false);
  int64_t total = 0;
  for (size_t l = 0; l < shards.size(); ++l) {
    if (total + shards[l] > max_in_cpu) continue;
    total += shards[l];
    resident[l] = true;
  }
  return resident;
}

}  // namespace

int64_t ParamSwapper::FileBytes(const std::vector<int64_t>& shard_elements, int64_t max_in_cpu) {
  const std::vector<bool> resident = ResidentLayers(shard_elements, max_in_cpu);
  int64_t bytes = 0;
  for (size_t l = 0; l < shard_elements.size(); ++l) {
    if (!resident[l]) bytes += AlignUp(shard_elements[l] * static_cast<int64_t>(sizeof(float)));
  }
  return bytes;
}

ParamSwapper::ParamSwapper(IoEngine* io, const std::string& path,
                           std::vector<int64_t> shard_elements, const ParamSwapOptions& options,
                           Allocator& allocator, Allocator& buffer_allocator)
    : shard_elements_(std::move(shard_elements)),
      offsets_(shard_elements_.size(), -1),
      resident_(shard_elements_.size()),
      last_write_slot_(shard_elements_.size(), -1),
      shape_only_(!allocator.holds_data()) {
  ZTRAIN_CHECK(options.buffer_count >= 1, "offload_param.buffer_count must be >= 1");
  ZTRAIN_ASSERT(io != nullptr || shape_only_, "a parameter swapper needs an I/O engine");
  const std::vector<bool> resident = ResidentLayers(shard_elements_, options.max_in_cpu);
  int64_t offset = 0, largest = 0;
  for (size_t l = 0; l < shard_elements_.size(); ++l) {
    const int64_t n = shard_elements_[l];
    if (resident[l]) {
      resident_[l] = Buffer(allocator, DType::kF32, {n}, MemoryCategory::kParameters);
      resident_[l].Zero();
      resident_elements_ += n;
      continue;
    }
    ZTRAIN_CHECK_T(ConfigError, n <= options.buffer_elements, "zero_optimization.offload_param."
                   "buffer_size is ", options.buffer_elements, " elements but layer ", l,
                   "'s parameter shard on this rank has ", n, "; set buffer_size to at least ", n);
    offsets_[l] = offset;
    offset += AlignUp(Bytes(l));
    largest = std::max(largest, n);
  }
  if (offset == 0) return;  // everything fits in memory: no file, no buffers
  if (!shape_only_) file_ = SwapFile::Create(*io, path, offset);
  // Buffers as large as the largest swapped shard: buffer_size only bounds them.
  slots_.resize(static_cast<size_t>(options.buffer_count));
  for (Slot& s : slots_) {
    s.buffer = IoBuffer(buffer_allocator, largest * static_cast<int64_t>(sizeof(float)));
    if (!shape_only_) s.buffer.Register(*io);
  }
}

ParamSwapper::~ParamSwapper() {
  for (Slot& s : slots_) {
    if (!s.work) continue;
    try {
      s.work->Wait();
    } catch (const std::exception&) {
    }
  }
}

ParamSwapper::Slot* ParamSwapper::FindReading(size_t layer) {
  for (Slot& s : slots_) {
    if (!s.writing && !s.held && s.layer == static_cast<int64_t>(layer)) return &s;
  }
  return nullptr;
}

void ParamSwapper::Finish(Slot& slot) {
  if (slot.work) {
    IoWorkPtr work = std::move(slot.work);
    const bool writing = slot.writing;
    const int64_t layer = slot.layer;
    slot.writing = false;
    slot.layer = -1;
    if (writing && last_write_slot_[layer] == &slot - slots_.data()) last_write_slot_[layer] = -1;
    work->Wait();
  }
  slot.writing = false;
  slot.layer = -1;
}

ParamSwapper::Slot& ParamSwapper::FreeSlot() {
  for (Slot& s : slots_) {
    if (!s.work && !s.held) return s;
  }
  for (Slot& s : slots_) {
    if (s.writing && s.work->Done()) {
      Finish(s);
      return s;
    }
  }
  for (Slot& s : slots_) {
    if (s.writing) {
      Finish(s);
      return s;
    }
  }
  // Every buffer holds a read-ahead: the latest is dropped (layers are asked for in the order
  // they were prefetched, so it is needed last).
  Slot* latest = nullptr;
  for (Slot& s : slots_) {
    if (!s.held && (!latest || s.issued > latest->issued)) latest = &s;
  }
  ZTRAIN_ASSERT(latest != nullptr, "every parameter swap buffer is held");
  Finish(*latest);
  return *latest;
}

void ParamSwapper::WaitForWritesOf(size_t layer) {
  const int64_t slot = last_write_slot_[layer];
  if (slot >= 0) Finish(slots_[static_cast<size_t>(slot)]);
}

void ParamSwapper::Prefetch(size_t layer) {
  if (shape_only_ || resident(layer) || FindReading(layer) != nullptr) return;
  const int64_t pending = last_write_slot_[layer];
  if (pending >= 0 && !slots_[static_cast<size_t>(pending)].work->Done()) return;
  WaitForWritesOf(layer);  // done already: collects its outcome
  for (Slot& s : slots_) {
    if (s.work && s.writing && s.work->Done()) Finish(s);
    if (s.work || s.held) continue;
    s.layer = static_cast<int64_t>(layer);
    s.issued = ++issued_;
    s.work = file_->Read(offsets_[layer], s.buffer, Bytes(layer));
    return;
  }
}

void ParamSwapper::CopyOut(size_t layer, float* out) {
  if (shape_only_) return;
  if (resident(layer)) {
    std::memcpy(out, resident_[layer].data(), static_cast<size_t>(Bytes(layer)));
    return;
  }
  if (const int64_t writing = last_write_slot_[layer]; writing >= 0) {
    // Being written (or written) from this buffer: the latest values are there.
    std::memcpy(out, slots_[static_cast<size_t>(writing)].buffer.data(),
                static_cast<size_t>(Bytes(layer)));
    return;
  }
  Slot& slot = ReadInto(layer);
  std::memcpy(out, slot.buffer.data(), static_cast<size_t>(Bytes(layer)));
  slot.layer = -1;
}

ParamSwapper::Slot& ParamSwapper::ReadInto(size_t layer) {
  Slot* slot = FindReading(layer);
  if (slot == nullptr) {
    WaitForWritesOf(layer);
    slot = &FreeSlot();
    slot->layer = static_cast<int64_t>(layer);
    slot->issued = ++issued_;
    slot->work = file_->Read(offsets_[layer], slot->buffer, Bytes(layer));
  }
  IoWorkPtr work = slot->work;
  try {
    work->Wait();
  } catch (...) {
    Finish(*slot);
    throw;
  }
  slot->work.reset();
  return *slot;
}

float* ParamSwapper::Acquire(size_t layer) {
  if (shape_only_) return nullptr;
  if (resident(layer)) return resident_[layer].data<float>();
  Slot& slot = ReadInto(layer);
  slot.held = true;
  return reinterpret_cast<float*>(slot.buffer.data());
}

void ParamSwapper::Release(size_t layer, bool changed) {
  if (shape_only_ || resident(layer)) return;
  Slot* slot = nullptr;
  for (Slot& s : slots_) {
    if (s.held && s.layer == static_cast<int64_t>(layer)) slot = &s;
  }
  ZTRAIN_ASSERT(slot != nullptr, "layer ", layer, " was not acquired");
  slot->held = false;
  if (!changed) {
    slot->layer = -1;
    return;
  }
  slot->issued = ++issued_;
  slot->writing = true;
  slot->work = file_->Write(offsets_[layer], slot->buffer, Bytes(layer));
  last_write_slot_[layer] = slot - slots_.data();
}

void ParamSwapper::Store(size_t layer, const float* in) {
  if (shape_only_) return;
  if (resident(layer)) {
    std::memcpy(resident_[layer].data(), in, static_cast<size_t>(Bytes(layer)));
    return;
  }
  if (Slot* stale = FindReading(layer)) Finish(*stale);  // a read-ahead of the old values
  WaitForWritesOf(layer);  // two writes of one record in flight would land in any order
  Slot& slot = FreeSlot();
  std::memcpy(slot.buffer.data(), in, static_cast<size_t>(Bytes(layer)));
  slot.layer = static_cast<int64_t>(layer);
  slot.issued = ++issued_;
  slot.writing = true;
  slot.work = file_->Write(offsets_[layer], slot.buffer, Bytes(layer));
  last_write_slot_[layer] = &slot - slots_.data();
}

void ParamSwapper::Flush() {
  for (Slot& s : slots_) {
    if (s.writing) Finish(s);
  }
}

}  // namespace ztrain::offload
