#include "offload/io/io_request.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ztrain::offload::detail {
namespace {

using ::ztrain::detail::StrCat;

// Resubmits in a row that move nothing (EINTR, EAGAIN, a 0-byte write) before a piece fails.
constexpr int kMaxStalls = 16;

const char* OpName(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

}  // namespace

std::string ErrnoText(int err) {
  const char* name = strerrorname_np(err);
  return StrCat(std::strerror(err), " (", name ? name : "errno " + std::to_string(err), ")");
}

OpenFile::~OpenFile() {
  if (fd_ >= 0) close(fd_);
}

int64_t OpenFile::CurrentSize() const {
  struct stat st;
  return fstat(fd_, &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

IoRequest::IoRequest(IoOp op, std::shared_ptr<const OpenFile> file, int64_t offset, char* data,
                     int64_t length, int64_t needed, IoCounters& counters)
    : op_(op),
      file_(std::move(file)),
      offset_(offset),
      data_(data),
      length_(length),
      needed_(needed),
      counters_(counters) {
  ++counters_.requests;
  if (length_ == 0) done_ = true;
}

void IoRequest::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (!error_.empty()) throw IoError(error_);
}

bool IoRequest::Done() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool IoRequest::NextPiece(const std::shared_ptr<IoRequest>& self, int64_t block, Piece* piece) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_ || !error_.empty() || issued_ >= length_) return false;
  piece->request = self;
  piece->offset = offset_ + issued_;
  piece->data = data_ + issued_;
  piece->length = std::min(block, length_ - issued_);
  piece->need = std::clamp<int64_t>(needed_ - issued_, 0, piece->length);
  piece->done = 0;
  piece->stalls = 0;
  piece->error.clear();
  issued_ += piece->length;
  ++in_flight_;
  ++counters_.pieces;
  return true;
}

void IoRequest::PieceDone(const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  --in_flight_;
  if (!error.empty() && error_.empty()) error_ = error;
  if (in_flight_ == 0 && (issued_ >= length_ || !error_.empty())) FinishLocked();
}

void IoRequest::Fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.empty()) {
    error_ = StrCat(OpName(op_), " of ", length_, " bytes at offset ", offset_, " of ",
                    file_->path(), " failed: ", why);
  }
  if (in_flight_ == 0) FinishLocked();
}

void IoRequest::FinishLocked() {
  if (done_) return;
  done_ = true;
  if (!error_.empty()) ++counters_.failures;
  cv_.notify_all();
}

Piece::Next Piece::Advance(int64_t result) {
  const IoRequest& r = *request;
  const bool read = r.op() == IoOp::kRead;
  auto fail = [&](const std::string& why) {
    error = StrCat(OpName(r.op()), " of ", remaining(), " bytes at offset ", next_offset(), " of ",
                   r.file().path(), " failed: ", why);
    if (next_offset() != r.offset() || remaining() != r.length()) {
      error += StrCat(" (part of a ", r.length(), "-byte ", OpName(r.op()), " at offset ",
                      r.offset(), ")");
    }
    return Next::kFailed;
  };
  auto short_file = [&] {
    return fail(StrCat("short file: expected ", r.needed(), " bytes at offset ", r.offset(),
                       ", file has ", r.file().CurrentSize()));
  };
  if (result < 0 && result != -EINTR && result != -EAGAIN) {
    return fail(ErrnoText(-static_cast<int>(result)));
  }
  if (result > 0) (read ? r.counters().bytes_read : r.counters().bytes_written) += result;
  if (result == 0 && read) return done >= need ? Next::kDone : short_file();
  const int64_t before = done;
  if (result > 0) done += result;
  if (done >= length || (read && done >= need)) return Next::kDone;
  // A short transfer. O_DIRECT restarts at an aligned offset: a read can only stop at an
  // unaligned point at the end of the file; a write simply rewrites the unaligned tail.
  if (r.file().direct() && done % kIoAlignment != 0) {
    if (read) return short_file();
    done -= done % kIoAlignment;
  }
  stalls = done > before ? 0 : stalls + 1;
  if (stalls > kMaxStalls) {
    return fail(StrCat("no progress after ", kMaxStalls, " attempts (last result ",
                       result < 0 ? ErrnoText(-static_cast<int>(result)) : std::to_string(result),
                       ")"));
  }
  ++r.counters().resubmits;
  return Next::kSubmit;
}

}  // namespace ztrain::offload::detail
