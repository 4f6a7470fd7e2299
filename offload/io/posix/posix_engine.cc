#include "offload/io/posix/posix_engine.h"

#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "offload/io/io_request.h"

namespace ztrain::offload::detail {
namespace {

using ::ztrain::detail::StrCat;

class PosixEngine final : public IoEngine {
 public:
  PosixEngine(const IoOptions& options, std::string why) : IoEngine(options), why_(std::move(why)) {
    try {
      for (int i = 0; i < options.threads; ++i) workers_.emplace_back([this] { Run(); });
    } catch (...) {
      Stop();
      throw;
    }
  }
  ~PosixEngine() override { Stop(); }

  std::string backend() const override {
    const int n = options().threads;
    return StrCat("pread/pwrite (", options().direct ? "O_DIRECT" : "buffered", "), ", n,
                  n == 1 ? " thread" : " threads", " (", why_, ")");
  }
  bool uses_io_uring() const override { return false; }

 private:
  void Submit(std::shared_ptr<IoRequest> request) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(request));
    }
    cv_.notify_all();
  }

  void Run() {
    Piece piece;
    while (TakePiece(&piece)) {
      Transfer(piece);
      std::shared_ptr<IoRequest> request = std::move(piece.request);
      request->PieceDone(piece.error);
    }
  }

  // The next piece of the oldest request; false once stopping with nothing left.
  bool TakePiece(Piece* piece) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return false;
      if (queue_.front()->NextPiece(queue_.front(), options().block_size, piece)) return true;
      queue_.pop_front();
    }
  }

  // Workers drain the queue before they stop, so every request issued completes.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  static void Transfer(Piece& piece) {
    const int fd = piece.request->file().fd();
    const bool read = piece.request->op() == IoOp::kRead;
    for (;;) {
      const ssize_t n = read
                            ? pread(fd, piece.next_data(), piece.remaining(), piece.next_offset())
                            : pwrite(fd, piece.next_data(), piece.remaining(), piece.next_offset());
      if (piece.Advance(n < 0 ? -errno : n) != Piece::Next::kSubmit) return;
    }
  }

  const std::string why_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<IoRequest>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoEngine> MakePosixEngine(const IoOptions& options, const std::string& why) {
  return std::make_unique<PosixEngine>(options, why);
}

}  // namespace ztrain::offload::detail
