#pragma once
// Internals shared by the I/O backends: an open file, a request and its pieces.
//
// An IoRequest is one SwapFile::Read or Write. Backends take pieces from it (NextPiece) on
// their own threads, run each with pread/pwrite or an io_uring SQE, feed every result back
// through Piece::Advance (which decides: done, resubmit the rest, or fail) and hand finished
// pieces back (PieceDone). The request completes when no piece is left to issue and none is
// in flight. After the first failure no new piece of that request is issued. IoRequest is
// thread safe; a Piece belongs to the one thread running it.
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "offload/io/io_engine.h"

namespace ztrain::offload::detail {

// "No space left on device (ENOSPC)".
std::string ErrnoText(int err);

// A file descriptor shared by a SwapFile and the requests in flight on it, so that it stays
// open until the last of them completes even when the SwapFile goes first.
class OpenFile {
 public:
  OpenFile(int fd, std::string path, bool direct)
      : fd_(fd), path_(std::move(path)), direct_(direct) {}
  ~OpenFile();
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  // The file's current size (fstat), or -1 when fstat fails.
  int64_t CurrentSize() const;

 private:
  int fd_;
  std::string path_;
  bool direct_;
};

enum class IoOp { kRead, kWrite };

struct Piece;

class IoRequest final : public IoWork {
 public:
  // Moves `length` bytes (a multiple of kIoAlignment) at `offset`. A read succeeds once the
  // first `needed` bytes have arrived (the rest may lie past the end of the file).
  IoRequest(IoOp op, std::shared_ptr<const OpenFile> file, int64_t offset, char* data,
            int64_t length, int64_t needed, IoCounters& counters);
  void Wait() override;
  bool Done() override;

  // Fills `piece` with the next piece of at most `block` bytes; false when none is left to
  // issue (all issued, or the request failed).
  bool NextPiece(const std::shared_ptr<IoRequest>& self, int64_t block, Piece* piece);
  // A piece finished; `error` is empty on success. Completes the request after its last piece.
  void PieceDone(const std::string& error);
  // Fails the request for `why` (e.g. a broken engine): no further piece is issued, and it
  // completes once the pieces in flight are done.
  void Fail(const std::string& why);

  IoOp op() const { return op_; }
  const OpenFile& file() const { return *file_; }
  int64_t offset() const { return offset_; }
  int64_t length() const { return length_; }
  int64_t needed() const { return needed_; }
  IoCounters& counters() const { return counters_; }

 private:
  void FinishLocked();

  const IoOp op_;
  const std::shared_ptr<const OpenFile> file_;
  const int64_t offset_;
  char* const data_;
  const int64_t length_;
  const int64_t needed_;
  IoCounters& counters_;

  std::mutex mu_;
  std::condition_variable cv_;
  int64_t issued_ = 0;  // bytes cut into pieces so far
  int in_flight_ = 0;   // pieces issued and not yet done
  bool done_ = false;
  std::string error_;  // first failure
};

// One piece of a request: a contiguous transfer, possibly in several system calls.
struct Piece {
  enum class Next { kSubmit, kDone, kFailed };

  std::shared_ptr<IoRequest> request;
  int64_t offset = 0;  // file offset of the piece
  char* data = nullptr;
  int64_t length = 0;  // bytes to transfer
  int64_t need = 0;    // bytes that must transfer (a read's last piece may end past EOF)
  int64_t done = 0;    // transferred so far
  int stalls = 0;      // resubmits that made no progress
  std::string error;   // set when Advance returns kFailed

  // What remains to transfer: the next system call's file offset, address and length.
  int64_t next_offset() const { return offset + done; }
  char* next_data() const { return data + done; }
  int64_t remaining() const { return length - done; }
  // Accounts one system call's result (bytes moved, or -errno) and says what comes next.
  Next Advance(int64_t result);
};

}  // namespace ztrain::offload::detail
