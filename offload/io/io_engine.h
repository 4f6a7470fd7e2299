#pragma once
// IoEngine: asynchronous file I/O for NVMe offload (DESIGN.md "offload/", docs/architecture.md
// "Offload I/O").
//
// One engine serves many files (SwapFile is how code issues I/O; it hands each Read or Write
// to its engine as one request). The engine cuts a request into pieces of
// options().block_size bytes and runs them on one of two backends, chosen by Make:
//   io_uring       one ring owned by one worker thread, up to queue_depth pieces in flight;
//   pread/pwrite   a pool of `threads` worker threads, one piece per thread at a time, used
//                  when io_uring is not built, cannot be set up (EPERM, ENOSYS: seccomp,
//                  io_uring_disabled, old kernel) or options().force_fallback is set. Make
//                  says why once per process (a warning in the log) and backend() names it.
// A short transfer is resubmitted for the rest of the piece; a read that meets the end of the
// file before all its bytes is a "short file" IoError.
//
// Thread safety: Make, backend(), options() and stats() may be called from any thread, and so
// may SwapFile's Read and Write (requests are queued under a lock). The engine's own threads
// do the I/O and complete the IoWork handles; IoWork::Wait may be called from any thread.
// There is no ordering between requests in flight: wait for a write before reading the same
// bytes back. Destroying the engine waits for every request already issued; SwapFiles must
// not issue after that (the engine outlives its files, as an allocator its buffers).
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "offload/io/io_options.h"

namespace ztrain::offload {

class SwapFile;
namespace detail {
class IoRequest;
}

// The completion handle of one Read or Write.
class IoWork {
 public:
  virtual ~IoWork() = default;
  // Blocks until every piece is done; throws IoError naming the file, offset, size and the
  // system's error text when any piece failed. Repeated calls repeat the outcome.
  virtual void Wait() = 0;
  // True once the request has finished, successfully or not (Wait then says which).
  virtual bool Done() = 0;
};
using IoWorkPtr = std::shared_ptr<IoWork>;

// Totals since the engine was made.
struct IoStats {
  int64_t requests = 0;    // Read and Write calls that reached the engine
  int64_t pieces = 0;      // block_size pieces issued
  int64_t resubmits = 0;   // pieces issued again after a short transfer or EINTR/EAGAIN
  int64_t failures = 0;    // requests that completed with an IoError
  int64_t bytes_read = 0;  // bytes the kernel reported transferred
  int64_t bytes_written = 0;
  int64_t fixed_pieces = 0;  // pieces issued as io_uring fixed-buffer reads and writes
};

namespace detail {
struct IoCounters {
  std::atomic<int64_t> requests{0}, pieces{0}, resubmits{0}, failures{0};
  std::atomic<int64_t> bytes_read{0}, bytes_written{0}, fixed_pieces{0};
};
}  // namespace detail

class IoEngine {
 public:
  // The io_uring engine where it can be built and set up, else the pread/pwrite pool (see the
  // header comment). Throws ztrain::Error for options it cannot run: block_size not a
  // positive multiple of kIoAlignment, queue_depth outside [1, 4096], threads outside
  // [1, 256].
  static std::unique_ptr<IoEngine> Make(const IoOptions& options);
  virtual ~IoEngine() = default;
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // What runs the I/O and why, e.g. "io_uring (O_DIRECT), queue depth 8, 1.00 MiB pieces" or
  // "pread/pwrite (O_DIRECT), 1 thread (io_uring unavailable: Operation not permitted
  // (EPERM))". O_DIRECT here is what the options ask for; SwapFile::direct() says per file.
  virtual std::string backend() const = 0;
  virtual bool uses_io_uring() const = 0;
  const IoOptions& options() const { return options_; }
  IoStats stats() const;

  // Registered buffers (io_uring_register_buffers): the kernel pins a registered buffer's
  // pages once, not on every transfer, and pieces inside it go out as READ_FIXED/WRITE_FIXED.
  // RegisterBuffer returns the buffer's slot, or -1 when it stays a plain buffer: the backend
  // has none (pread/pwrite), RLIMIT_MEMLOCK is too small for the pinned pages, the buffer is
  // over 1 GiB, or every slot is taken. Either way I/O on it works the same. Call
  // UnregisterBuffer(slot) before the memory is freed, with no I/O on it in flight. IoBuffer::
  // Register does both. Thread safe. fixed_buffers() says what this engine does, e.g.
  // "registered buffers (64 slots)" or "plain buffers (io_uring register: ...)".
  virtual int RegisterBuffer(char* data, int64_t bytes) {
    (void)data;
    (void)bytes;
    return -1;
  }
  virtual void UnregisterBuffer(int slot) { (void)slot; }
  virtual std::string fixed_buffers() const { return "plain buffers (pread/pwrite)"; }

 protected:
  explicit IoEngine(const IoOptions& options) : options_(options) {}
  detail::IoCounters& counters() { return counters_; }

 private:
  friend class SwapFile;
  // Queues a request; its pieces run on the engine's threads.
  virtual void Submit(std::shared_ptr<detail::IoRequest> request) = 0;

  IoOptions options_;
  detail::IoCounters counters_;
};

}  // namespace ztrain::offload
