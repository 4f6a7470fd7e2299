#include "parallel/comm/communicator.h"

#include <algorithm>
#include <cstring>

#include "parallel/comm/comm_util.h"

namespace ztrain::comm {

const char* OpKindName(OpKind k) {
  switch (k) {
    case OpKind::kAllReduce:
      return "AllReduce";
    case OpKind::kReduceScatter:
      return "ReduceScatter";
    case OpKind::kAllGather:
      return "AllGather";
    case OpKind::kBroadcast:
      return "Broadcast";
    case OpKind::kSend:
      return "Send";
    case OpKind::kRecv:
      return "Recv";
    case OpKind::kBarrier:
      return "Barrier";
    case OpKind::kAllToAll:
      return "AllToAll";
  }
  return "?";
}

int64_t CommStats::TotalBytes() const {
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  return total;
}

namespace {

// A group of one: collectives finish when issued. Ops are still checked and counted
// (with zero bytes), so code that runs at dp = 1 is checked the same way.
class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(CopyFn copy) : copy_(std::move(copy)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return detail::GroupName(label_, {0}); }
  void set_label(const std::string& label) override { label_ = label; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  WorkPtr AllReduce(const Tensor& t, ReduceOp op) override {
    detail::CheckReduce(t, op);
    return Count(OpKind::kAllReduce, t.nbytes());
  }
  WorkPtr ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    detail::CheckReduceScatter(in, out, op, 0, 1);
    CopyUnlessSame("ReduceScatter", in, out);
    return Count(OpKind::kReduceScatter, in.nbytes());
  }
  WorkPtr AllGather(const Tensor& in, const Tensor& out) override {
    detail::CheckAllGather(in, out, 0, 1);
    CopyUnlessSame("AllGather", in, out);
    return Count(OpKind::kAllGather, out.nbytes());
  }
  WorkPtr AllToAll(const Tensor& in, const Tensor& out) override {
    detail::CheckAllToAll(in, out, 1);
    CopyUnlessSame("AllToAll", in, out);
    return Count(OpKind::kAllToAll, in.nbytes());
  }
  WorkPtr Broadcast(const Tensor& t, int root) override {
    detail::CheckRoot(root, 1);
    return Count(OpKind::kBroadcast, t.nbytes());
  }
  WorkPtr Send(const Tensor&, int peer, int tag) override {
    detail::CheckPeer("Send", peer, 0, 1, tag);
    return nullptr;  // unreachable: a group of one has no peer
  }
  WorkPtr Recv(const Tensor&, int peer, int tag) override {
    detail::CheckPeer("Recv", peer, 0, 1, tag);
    return nullptr;
  }
  WorkPtr Barrier() override { return Count(OpKind::kBarrier, 0); }
  std::unique_ptr<Communicator> Split(int color, int /*key*/) override {
    ZTRAIN_CHECK(color >= 0, "Split: color ", color, " is negative");
    auto split = std::make_unique<SelfCommunicator>(copy_);
    split->label_ = "group";
    split->timeout_ = timeout_;
    return split;
  }
  CommStats stats() const override { return stats_; }

 private:
  WorkPtr Count(OpKind kind, int64_t nbytes) {
    detail::CountOp(stats_, kind, nbytes, 1);
    return detail::FinishedWork();
  }

  // Copies `src` to `dst` unless they are the same memory: with copy_, or on the host.
  void CopyUnlessSame(const char* op, const Tensor& src, const Tensor& dst) {
    if (src.data() == dst.data()) return;
    if (copy_) {
      copy_(src, dst);
      return;
    }
    detail::CheckHost(op, src);
    detail::CheckHost(op, dst);
    std::memmove(dst.data(), src.data(), src.nbytes());
  }

  CopyFn copy_;
  std::string label_ = "world";
  std::chrono::milliseconds timeout_{std::chrono::minutes(5)};
  CommStats stats_;
};

}  // namespace

std::unique_ptr<Communicator> MakeSelfCommunicator(CopyFn copy) {
  return std::make_unique<SelfCommunicator>(std::move(copy));
}

std::vector<int32_t> AllGatherInts(Communicator& comm, const std::vector<int32_t>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<int32_t> mine = values, all(static_cast<size_t>(n * comm.size()));
  if (n == 0) return all;
  comm.AllGather(Tensor(mine.data(), DType::kI32, {n}),
                 Tensor(all.data(), DType::kI32, {n * comm.size()}))
      ->Wait();
  return all;
}

std::vector<std::string> AllGatherText(Communicator& comm, const std::string& text,
                                       int64_t max_bytes) {
  const int64_t words = (max_bytes + 3) / 4;  // bytes travel as int32 words, bit for bit
  std::vector<int32_t> mine(static_cast<size_t>(words), 0);
  std::memcpy(mine.data(), text.data(),
              std::min<size_t>(text.size(), static_cast<size_t>(words * 4 - 1)));
  const std::vector<int32_t> all = AllGatherInts(comm, mine);
  std::vector<std::string> out;
  for (int r = 0; r < comm.size(); ++r) {
    const char* p = reinterpret_cast<const char*>(all.data() + r * words);
    out.emplace_back(p, strnlen(p, static_cast<size_t>(words * 4)));
  }
  return out;
}

}  // namespace ztrain::comm
