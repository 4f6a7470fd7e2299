#include "offload/io/io_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/logging.h"
#include "offload/io/io_engine.h"
#include "offload/io/io_options.h"

namespace ztrain::offload {

IoBuffer::IoBuffer(Allocator& allocator, int64_t bytes, MemoryCategory category) {
  ZTRAIN_CHECK(bytes > 0, "an I/O buffer needs at least one byte, got ", bytes);
  ZTRAIN_CHECK(allocator.device().is_cpu(),
               "I/O buffers live in host memory; got an allocator for ",
               allocator.device().ToString());
  const int64_t capacity = AlignUp(bytes);
  buffer_ = Buffer(allocator, static_cast<size_t>(capacity), category);
  ZTRAIN_CHECK(reinterpret_cast<uintptr_t>(buffer_.data()) % kIoAlignment == 0, "I/O buffers need ",
               kIoAlignment, "-byte aligned memory; this allocator gave ", buffer_.data());
  size_ = bytes;
  if (!buffer_.holds_data()) return;  // shape-only: nothing to zero or lock
  std::memset(data() + bytes, 0, static_cast<size_t>(capacity - bytes));
  // Over RLIMIT_MEMLOCK mlock fails with ENOMEM or EPERM: the buffer then stays pageable.
  pinned_ = mlock(buffer_.data(), static_cast<size_t>(capacity)) == 0;
  if (!pinned_) {
    Log().debug("I/O buffer of {} not pinned: mlock failed ({}); RLIMIT_MEMLOCK is too small",
                FormatBytes(capacity), std::strerror(errno));
  }
}

IoBuffer& IoBuffer::operator=(IoBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    buffer_ = std::move(other.buffer_);
    size_ = std::exchange(other.size_, 0);
    pinned_ = std::exchange(other.pinned_, false);
    engine_ = std::exchange(other.engine_, nullptr);
    slot_ = std::exchange(other.slot_, -1);
  }
  return *this;
}

bool IoBuffer::Register(IoEngine& engine) {
  ZTRAIN_CHECK(size_ > 0, "register an I/O buffer after allocating it");
  Unregister();
  if (!buffer_.holds_data()) return false;
  slot_ = engine.RegisterBuffer(data(), capacity());
  if (slot_ >= 0) engine_ = &engine;
  return registered();
}

void IoBuffer::Unregister() noexcept {
  if (slot_ >= 0) engine_->UnregisterBuffer(slot_);
  slot_ = -1;
  engine_ = nullptr;
}

void IoBuffer::Reset() noexcept {
  Unregister();
  if (pinned_) munlock(buffer_.data(), buffer_.nbytes());
  pinned_ = false;
  size_ = 0;
  buffer_.Reset();
}

}  // namespace ztrain::offload
