#include "nn/model_file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>

#include "core/error.h"
#include "core/json_text.h"

namespace ztrain::nn::detail {

nlohmann::json ParseJsonFile(const std::string& path, const char* what) {
  const nlohmann::json j = ParseJsonOrThrow<IoError>(ReadTextFile(path, what),
                                                     ztrain::detail::StrCat(what, " '", path, "'"));
  ZTRAIN_CHECK_T(IoError, j.is_object(), what, " '", path,
                 "' is JSON but not an object (it holds a ", j.type_name(), ")");
  return j;
}

void WriteJsonFile(const std::string& path, const nlohmann::json& j) {
  const std::string text = j.dump(2) + "\n";
  AtomicFileWriter out(path, "JSON file");
  out.Write(text.data(), text.size());
  out.Commit();
}
namespace {

std::string ErrnoText() { return std::strerror(errno); }

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path, std::string what)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), what_(std::move(what)) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZTRAIN_CHECK_T(IoError, fd_ >= 0, "cannot create ", what_, " '", tmp_, "': ", ErrnoText());
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFileWriter::Write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    ZTRAIN_CHECK_T(IoError, n > 0, "writing ", what_, " '", tmp_, "' (for '", path_,
                   "') failed: ", ErrnoText());
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::Commit() {
  ZTRAIN_CHECK_T(IoError, ::fsync(fd_) == 0, "cannot sync ", what_, " '", tmp_, "': ", ErrnoText());
  const int rc = ::close(fd_);
  fd_ = -1;
  ZTRAIN_CHECK_T(IoError, rc == 0, "cannot close ", what_, " '", tmp_, "': ", ErrnoText());
  ZTRAIN_CHECK_T(IoError, std::rename(tmp_.c_str(), path_.c_str()) == 0, "cannot rename '", tmp_,
                 "' to '", path_, "': ", ErrnoText());
  committed_ = true;
}

InputFile::InputFile(const std::string& path, std::string what)
    : path_(path), what_(std::move(what)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  ZTRAIN_CHECK_T(IoError, fd_ >= 0, "cannot open ", what_, " '", path_, "': ", ErrnoText());
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const std::string err = ErrnoText();
    ::close(fd_);
    throw IoError(ztrain::detail::StrCat("cannot stat ", what_, " '", path_, "': ", err));
  }
  size_ = st.st_size;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool InputFile::ReadAt(int64_t offset, void* dst, size_t bytes) const {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    ZTRAIN_CHECK_T(IoError, n >= 0, "reading ", what_, " '", path_, "' failed: ", ErrnoText());
    if (n == 0) return false;  // end of file
    p += n;
    offset += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace ztrain::nn::detail
