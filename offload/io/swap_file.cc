#include "offload/io/swap_file.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>

#include "core/error.h"
#include "core/logging.h"
#include "core/memory_tracker.h"
#include "offload/io/io_request.h"

namespace ztrain::offload {
namespace {

using ::ztrain::detail::StrCat;

using detail::ErrnoText;

// Opens `path` with O_DIRECT when `want_direct`, else (or when the file system refuses it)
// buffered. Sets *direct to what was opened.
int OpenFd(const std::string& path, int flags, bool want_direct, bool* direct) {
  *direct = false;
  if (want_direct) {
    const int fd = open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0600);
    if (fd >= 0) {
      *direct = true;
      return fd;
    }
    ZTRAIN_CHECK_T(IoError, errno == EINVAL, "cannot open swap file ", path, ": ",
                   ErrnoText(errno));
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      Log().warn(
          "offload I/O: the file system of {} refuses O_DIRECT (EINVAL); swap files there use "
          "buffered I/O through the page cache (slower, and it takes host memory)",
          path);
    }
  }
  const int fd = open(path.c_str(), flags | O_CLOEXEC, 0600);
  ZTRAIN_CHECK_T(IoError, fd >= 0, "cannot open swap file ", path, ": ", ErrnoText(errno));
  return fd;
}

std::string DirectoryOf(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// Reserves `bytes` for the file; file systems without fallocate (ramfs) get a sparse file.
void Preallocate(int fd, const std::string& path, int64_t bytes) {
  if (bytes == 0 || fallocate(fd, 0, 0, bytes) == 0) return;
  const int err = errno;
  if (err == EOPNOTSUPP && ftruncate(fd, bytes) == 0) {
    Log().debug("offload I/O: {} cannot be preallocated (no fallocate); it is sparse", path);
    return;
  }
  std::string free_text = "unknown";
  try {
    const int64_t free_bytes = FreeBytes(DirectoryOf(path));
    free_text = StrCat(free_bytes, " (", FormatBytes(free_bytes), ")");
  } catch (const IoError&) {
  }
  const bool no_space = err == ENOSPC || err == EDQUOT;
  throw IoError(StrCat("cannot preallocate swap file ", path, ": ", bytes, " bytes (",
                       FormatBytes(bytes), ") needed at offset 0, ", free_text,
                       " bytes free on its file system: ", ErrnoText(err),
                       no_space ? "; free space there or point nvme_path at a larger disk" : ""));
}

}  // namespace

std::unique_ptr<SwapFile> SwapFile::Create(IoEngine& engine, const std::string& path,
                                           int64_t bytes) {
  ZTRAIN_CHECK(bytes >= 0, "swap file ", path, ": size must be >= 0, got ", bytes);
  const int64_t size = AlignUp(bytes);
  bool direct = false;
  const int fd = OpenFd(path, O_RDWR | O_CREAT | O_TRUNC, engine.options().direct, &direct);
  auto file = std::make_shared<const detail::OpenFile>(fd, path, direct);
  try {
    Preallocate(fd, path, size);
  } catch (const IoError&) {
    unlink(path.c_str());  // a half-allocated file would only hide the missing space
    throw;
  }
  return std::unique_ptr<SwapFile>(new SwapFile(engine, std::move(file), size));
}

std::unique_ptr<SwapFile> SwapFile::Open(IoEngine& engine, const std::string& path) {
  bool direct = false;
  const int fd = OpenFd(path, O_RDWR, engine.options().direct, &direct);
  auto file = std::make_shared<const detail::OpenFile>(fd, path, direct);
  const int64_t size = file->CurrentSize();
  ZTRAIN_CHECK_T(IoError, size >= 0, "cannot stat swap file ", path, ": ", ErrnoText(errno));
  return std::unique_ptr<SwapFile>(new SwapFile(engine, std::move(file), size));
}

SwapFile::SwapFile(IoEngine& engine, std::shared_ptr<const detail::OpenFile> file, int64_t size)
    : engine_(engine), file_(std::move(file)), size_(size) {}

SwapFile::~SwapFile() = default;

const std::string& SwapFile::path() const { return file_->path(); }

bool SwapFile::direct() const { return file_->direct(); }

IoWorkPtr SwapFile::Write(int64_t offset, const IoBuffer& buf, int64_t bytes) {
  const int64_t length = AlignUp(bytes);
  ZTRAIN_CHECK_T(IoError, offset + length <= size_, "write of ", bytes, " bytes at offset ", offset,
                 " of ", path(), " would pass the end of the file (", size_,
                 " bytes); create the swap file larger");
  return Issue(false, offset, buf.data(), bytes, buf.capacity());
}

IoWorkPtr SwapFile::Read(int64_t offset, IoBuffer& buf, int64_t bytes) {
  return Issue(true, offset, buf.data(), bytes, buf.capacity());
}

IoWorkPtr SwapFile::Issue(bool read, int64_t offset, char* data, int64_t bytes, int64_t capacity) {
  ZTRAIN_CHECK(offset >= 0 && offset % kIoAlignment == 0, "swap file offsets must be multiples of ",
               kIoAlignment, " bytes; got ", offset, " for ", path());
  ZTRAIN_CHECK(bytes >= 0 && bytes <= capacity, read ? "read" : "write", " of ", bytes,
               " bytes at offset ", offset, " of ", path(), " does not fit its buffer of ",
               capacity, " bytes");
  const int64_t length = AlignUp(bytes);
  auto request = std::make_shared<detail::IoRequest>(
      read ? detail::IoOp::kRead : detail::IoOp::kWrite, file_, offset, data, length,
      read ? bytes : length, engine_.counters());
  if (length > 0) engine_.Submit(request);
  return request;
}

int64_t FreeBytes(const std::string& path) {
  struct statvfs st;
  ZTRAIN_CHECK_T(IoError, statvfs(path.c_str(), &st) == 0, "cannot read the free space of ", path,
                 ": ", ErrnoText(errno));
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

}  // namespace ztrain::offload
