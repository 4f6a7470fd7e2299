#pragma once
// SwapFile: one file that tensors are swapped to and from (DeepSpeed's swap files under
// nvme_path).
//
// Create makes (or replaces) the file and preallocates it (fallocate), so that a full disk is
// found up front, not halfway through training; Open uses an existing file, e.g. a
// checkpoint's. Files are opened with O_DIRECT when the engine's options ask for it; where the
// file system refuses it (open fails with EINVAL: ramfs, tmpfs before Linux 6.6, some network
// file systems) the file uses buffered I/O and the log says so once per process.
// Offsets are multiples of kIoAlignment, and a transfer of `bytes` moves AlignUp(bytes) (the
// buffer's capacity covers it), so records laid out at aligned offsets never overlap.
// Read and Write return at once; the buffer must stay alive and untouched until the work is
// done. Mistakes in the call (an unaligned offset, more bytes than the buffer holds, a write
// past the end of the file) throw from the call itself; failures of the I/O (ENOSPC, EIO,
// EFBIG, a short file) throw IoError from IoWork::Wait. Every IoError names the file, the
// offset and the size. A failed write leaves the rest of the file as it was (the failed range
// may hold old and new bytes); the engine and the file stay usable.
// Thread safety: Read and Write may be called from any thread. Destroying a SwapFile does not
// wait: its descriptor is closed when the last I/O on it completes. The engine must outlive
// the file.
#include <cstdint>
#include <memory>
#include <string>

#include "offload/io/io_buffer.h"
#include "offload/io/io_engine.h"

namespace ztrain::offload {

namespace detail {
class OpenFile;
}

class SwapFile {
 public:
  // Creates or truncates `path` and preallocates AlignUp(bytes). Throws IoError when the file
  // cannot be made; when the space is missing (ENOSPC) the message names the bytes needed and
  // the bytes free, and no file is left behind.
  static std::unique_ptr<SwapFile> Create(IoEngine& engine, const std::string& path, int64_t bytes);
  // Opens an existing file for reading and writing; its size is what it holds now.
  static std::unique_ptr<SwapFile> Open(IoEngine& engine, const std::string& path);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  // Writes the first AlignUp(bytes) bytes of `buf` at `offset` (0 <= bytes <= capacity);
  // offset + AlignUp(bytes) must not pass size().
  IoWorkPtr Write(int64_t offset, const IoBuffer& buf, int64_t bytes);
  // Reads `bytes` at `offset` into `buf` (0 <= bytes <= capacity). A file that ends before
  // offset + bytes makes Wait throw IoError ("short file: expected N bytes at offset O, file
  // has S").
  IoWorkPtr Read(int64_t offset, IoBuffer& buf, int64_t bytes);

  const std::string& path() const;
  // Bytes in the file when it was created or opened.
  int64_t size() const { return size_; }
  // Whether the file was opened with O_DIRECT.
  bool direct() const;

 private:
  SwapFile(IoEngine& engine, std::shared_ptr<const detail::OpenFile> file, int64_t size);
  IoWorkPtr Issue(bool read, int64_t offset, char* data, int64_t bytes, int64_t capacity);

  IoEngine& engine_;
  std::shared_ptr<const detail::OpenFile> file_;
  int64_t size_;
};

// Free bytes for an unprivileged user on the file system holding `path` (a file or a
// directory; statvfs), for checking the space before creating swap files. Throws IoError.
int64_t FreeBytes(const std::string& path);

}  // namespace ztrain::offload
