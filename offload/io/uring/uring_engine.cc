// The io_uring backend (Note [io_uring worker]).
//
// Note [io_uring worker]: one thread owns the ring, so no two liburing calls ever race.
// Issuing threads queue requests under mu_ and write an eventfd; the worker keeps one read of
// that eventfd on the ring, so the io_uring_wait_cqe that waits for pieces also wakes it for
// new requests. Each piece in flight holds one of queue_depth slots, whose address is the
// SQE's user_data (null is the eventfd read).
//
// Note [registered buffers]: Init registers a sparse table of kBufferSlots empty buffer slots
// (io_uring_register_buffers_sparse, Linux 5.19); RegisterBuffer fills one with an IoBuffer's
// memory (io_uring_register_buffers_update_tag, which needs no quiesced ring) from any thread,
// and the kernel pins those pages once. The table of registered ranges, guarded by reg_mu_,
// is filled after the kernel accepts a buffer and emptied before the kernel drops it, so the
// worker, which looks up each piece's address there, only names slots the kernel holds; a
// piece inside a registered range goes out as READ_FIXED/WRITE_FIXED, any other as a plain
// READ/WRITE. For users without CAP_IPC_LOCK the pinned pages count against RLIMIT_MEMLOCK;
// a buffer over it is not registered (said once) and works as a plain one.
#include "offload/io/uring/uring_engine.h"

#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/logging.h"
#include "core/memory_tracker.h"
#include "offload/io/io_request.h"

namespace ztrain::offload::detail {
namespace {

using ::ztrain::detail::StrCat;

constexpr int kBufferSlots = 64;
constexpr int64_t kMaxRegisteredBytes = int64_t{1} << 30;  // the kernel's limit per buffer

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(const IoOptions& options)
      : IoEngine(options), slots_(static_cast<size_t>(options.queue_depth)) {
    for (Piece& s : slots_) free_.push_back(&s);
  }

  // Waits for every request issued (the worker drains its queue before it returns).
  ~UringEngine() override {
    if (worker_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      Wake();
      worker_.join();
    }
    if (ring_ready_) io_uring_queue_exit(&ring_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  // Sets up the ring and starts the worker; returns why not, or "" on success.
  std::string Init() {
    const int ret =
        io_uring_queue_init(static_cast<unsigned>(options().queue_depth) + 1, &ring_, 0);
    if (ret < 0) return "io_uring unavailable: " + ErrnoText(-ret);
    ring_ready_ = true;
    io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
    const bool ops = probe && io_uring_opcode_supported(probe, IORING_OP_READ) &&
                     io_uring_opcode_supported(probe, IORING_OP_WRITE);
    if (probe) io_uring_free_probe(probe);
    if (!ops) return "io_uring unavailable: the kernel lacks IORING_OP_READ/WRITE (Linux < 5.6)";
    const int reg = io_uring_register_buffers_sparse(&ring_, kBufferSlots);
    if (reg < 0) {
      fixed_why_ = "io_uring_register_buffers_sparse: " + ErrnoText(-reg);
    } else {
      registered_.resize(kBufferSlots);
    }
    wake_fd_ = eventfd(0, EFD_CLOEXEC);
    if (wake_fd_ < 0) return "io_uring unavailable: eventfd: " + ErrnoText(errno);
    worker_ = std::thread([this] { Run(); });
    return "";
  }

  std::string backend() const override {
    const IoOptions& o = options();
    return StrCat("io_uring (", o.direct ? "O_DIRECT" : "buffered", "), queue depth ",
                  o.queue_depth, ", ", FormatBytes(o.block_size), " pieces",
                  o.single_submit ? ", single submit" : "",
                  o.overlap_events ? "" : ", batches without overlap");
  }
  bool uses_io_uring() const override { return true; }

  int RegisterBuffer(char* data, int64_t bytes) override {
    if (bytes <= 0 || bytes > kMaxRegisteredBytes) return -1;
    std::lock_guard<std::mutex> lock(reg_mu_);
    const auto free_slot = std::find_if(registered_.begin(), registered_.end(),
                                        [](const Range& r) { return r.begin == nullptr; });
    if (free_slot == registered_.end()) return -1;
    const int slot = static_cast<int>(free_slot - registered_.begin());
    iovec iov{data, static_cast<size_t>(bytes)};
    const int ret =
        io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(slot), &iov, nullptr, 1);
    if (ret != 1) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) {
        Log().info(
            "offload I/O: a {} buffer stays unregistered with io_uring ({}); I/O works the same. "
            "Raise the locked-memory limit (ulimit -l, RLIMIT_MEMLOCK) to register swap buffers",
            FormatBytes(bytes), ErrnoText(ret < 0 ? -ret : EINVAL));
      }
      return -1;
    }
    *free_slot = Range{data, data + bytes};
    return slot;
  }

  void UnregisterBuffer(int slot) override {
    std::lock_guard<std::mutex> lock(reg_mu_);
    if (slot < 0 || slot >= static_cast<int>(registered_.size())) return;
    registered_[static_cast<size_t>(slot)] = Range{};
    iovec iov{nullptr, 0};
    const int ret =
        io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(slot), &iov, nullptr, 1);
    if (ret != 1) Log().debug("offload I/O: unregistering buffer slot {}: {}", slot, ret);
  }

  std::string fixed_buffers() const override {
    if (!fixed_why_.empty()) return "plain buffers (" + fixed_why_ + ")";
    return StrCat("registered buffers (", kBufferSlots, " slots)");
  }

 private:
  struct Range {
    char* begin = nullptr;
    char* end = nullptr;
  };

  // The registered slot holding [data, data + bytes), or -1.
  int FixedSlot(const char* data, int64_t bytes) {
    std::lock_guard<std::mutex> lock(reg_mu_);
    for (size_t i = 0; i < registered_.size(); ++i) {
      const Range& r = registered_[i];
      if (r.begin != nullptr && data >= r.begin && data + bytes <= r.end) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }

  void Submit(std::shared_ptr<IoRequest> request) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      incoming_.push_back(std::move(request));
    }
    Wake();
  }

  void Wake() {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = write(wake_fd_, &one, sizeof one);
    cv_.notify_all();
  }

  void Run() {
    ArmWake();
    for (;;) {
      const bool stop = TakeIncoming();
      IssuePieces();
      Flush();
      if (stop && in_flight_ == 0 && queue_.empty()) return;
      if (KernelHeld() > 0) {
        WaitAndReap();
      } else if (broken_) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !incoming_.empty(); });
      } else {  // a transient submit failure (EAGAIN) with nothing in the kernel to wait for
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }

  // Moves new requests to the worker's queue; returns whether the engine is stopping.
  bool TakeIncoming() {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::shared_ptr<IoRequest>& r : incoming_) {
      if (broken_) {
        r->Fail(broken_error_);
      } else {
        queue_.push_back(std::move(r));
      }
    }
    incoming_.clear();
    return stop_;
  }

  // Fills free slots with pieces of the oldest requests. Without overlap_events a new batch
  // starts only once the previous one has drained.
  void IssuePieces() {
    if (broken_ || (!options().overlap_events && in_flight_ > 0)) return;
    while (!free_.empty() && !queue_.empty()) {
      Piece* p = free_.back();
      if (!queue_.front()->NextPiece(queue_.front(), options().block_size, p)) {
        queue_.pop_front();
        continue;
      }
      free_.pop_back();
      ++in_flight_;
      Prep(p);
      if (options().single_submit) Flush();
    }
  }

  void ArmWake() {
    wake_armed_ = true;
    Prep(nullptr);
  }

  // Queues the SQE for a piece's remaining transfer (or, for null, the eventfd read). The
  // ring has queue_depth + 1 entries, one per slot and one for the eventfd read, so it never
  // runs out while the kernel consumes what Flush submits.
  void Prep(Piece* p) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (!sqe && !broken_) {
      Flush();
      sqe = io_uring_get_sqe(&ring_);
    }
    if (!sqe) {
      if (p) FailPiece(p, ECANCELED);
      return;
    }
    if (!p) {
      io_uring_prep_read(sqe, wake_fd_, &wake_value_, sizeof wake_value_, 0);
    } else {
      const int fd = p->request->file().fd();
      const auto n = static_cast<unsigned>(p->remaining());
      const auto offset = static_cast<uint64_t>(p->next_offset());
      const int slot = FixedSlot(p->next_data(), p->remaining());
      const bool read = p->request->op() == IoOp::kRead;
      if (slot < 0 && read) {
        io_uring_prep_read(sqe, fd, p->next_data(), n, offset);
      } else if (slot < 0) {
        io_uring_prep_write(sqe, fd, p->next_data(), n, offset);
      } else if (read) {
        io_uring_prep_read_fixed(sqe, fd, p->next_data(), n, offset, slot);
      } else {
        io_uring_prep_write_fixed(sqe, fd, p->next_data(), n, offset, slot);
      }
      if (slot >= 0 && p->done == 0) ++counters().fixed_pieces;
    }
    io_uring_sqe_set_data(sqe, p);
    unsubmitted_.push_back(p);
  }

  // Submits the queued SQEs. The kernel consumes them in order, so a partial submit leaves
  // the tail of unsubmitted_ for the next call.
  void Flush() {
    while (!broken_ && !unsubmitted_.empty()) {
      const int ret = io_uring_submit(&ring_);
      if (ret > 0) {
        const size_t n = std::min(unsubmitted_.size(), static_cast<size_t>(ret));
        unsubmitted_.erase(unsubmitted_.begin(), unsubmitted_.begin() + static_cast<long>(n));
      } else if (ret == -EINTR) {
        continue;
      } else if (ret == 0 || ret == -EAGAIN || ret == -EBUSY) {
        return;  // retried once completions have been reaped
      } else {
        Break(-ret);
      }
    }
  }

  // A submit error that is not transient: the SQEs still queued are never submitted (the
  // ring is not used for I/O again), their pieces and every queued request fail, and pieces
  // already in the kernel are reaped as usual.
  void Break(int err) {
    broken_ = true;
    broken_error_ = "io_uring submit failed: " + ErrnoText(err);
    Log().error("offload I/O: {}; the engine fails all further I/O", broken_error_);
    for (Piece* p : unsubmitted_) {
      if (p) {
        FailPiece(p, err);
      } else {
        wake_armed_ = false;
      }
    }
    unsubmitted_.clear();
    for (std::shared_ptr<IoRequest>& r : queue_) r->Fail(broken_error_);
    queue_.clear();
  }

  int KernelHeld() const {
    return in_flight_ + (wake_armed_ ? 1 : 0) - static_cast<int>(unsubmitted_.size());
  }

  void WaitAndReap() {
    io_uring_cqe* cqe = nullptr;
    const int ret = io_uring_wait_cqe(&ring_, &cqe);
    if (ret < 0) {
      if (ret != -EINTR && ret != -EAGAIN) {
        Log().error("offload I/O: io_uring_wait_cqe: {}", ErrnoText(-ret));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      return;
    }
    unsigned head = 0;
    unsigned count = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++count;
      OnCompletion(static_cast<Piece*>(io_uring_cqe_get_data(cqe)), cqe->res);
    }
    io_uring_cq_advance(&ring_, count);
  }

  void OnCompletion(Piece* p, int res) {
    if (!p) {  // the eventfd read: new requests (or stop) are waiting
      wake_armed_ = false;
      if (!broken_) ArmWake();
      return;
    }
    if (p->Advance(res) == Piece::Next::kSubmit) {
      if (!broken_) {
        Prep(p);
        if (options().single_submit) Flush();
        return;
      }
      p->Advance(-ECANCELED);
    }
    FinishPiece(p);
  }

  void FailPiece(Piece* p, int err) {
    p->Advance(-err);
    FinishPiece(p);
  }

  void FinishPiece(Piece* p) {
    std::shared_ptr<IoRequest> request = std::move(p->request);
    --in_flight_;
    free_.push_back(p);
    request->PieceDone(p->error);
  }

  io_uring ring_{};
  bool ring_ready_ = false;
  int wake_fd_ = -1;
  uint64_t wake_value_ = 0;  // the eventfd read's target; lives as long as the ring

  // Worker thread only.
  std::vector<Piece> slots_;
  std::vector<Piece*> free_;
  std::deque<Piece*> unsubmitted_;  // prepared SQEs in ring order (null: the eventfd read)
  std::deque<std::shared_ptr<IoRequest>> queue_;  // requests with pieces left to issue
  int in_flight_ = 0;                             // pieces holding a slot
  bool wake_armed_ = false;
  bool broken_ = false;
  std::string broken_error_;

  std::string fixed_why_;  // why buffers cannot be registered; empty when they can
  mutable std::mutex reg_mu_;
  std::vector<Range> registered_;  // by slot; empty without registered buffers

  std::mutex mu_;  // guards incoming_ and stop_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<IoRequest>> incoming_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<IoEngine> MakeUringEngine(const IoOptions& options, std::string* why_not) {
  auto engine = std::make_unique<UringEngine>(options);
  *why_not = engine->Init();
  if (!why_not->empty()) return nullptr;
  return engine;
}

}  // namespace ztrain::offload::detail
