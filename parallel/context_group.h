#pragma once
// The cp group of a context-parallel layout as the nn::ContextGroup attention exchanges over
// (Note [Context parallelism] and Note [Ring attention], nn/context_parallel.h).
#include <functional>
#include <memory>

#include "nn/context_parallel.h"
#include "parallel/comm/communicator.h"

namespace ztrain {

// Holds a reference to `cp`, which must outlive it (and every layer built with it).
class CommContextGroup final : public nn::ContextGroup {
 public:
  CommContextGroup(comm::Communicator& cp, nn::ContextAlgorithm algorithm)
      : ContextGroup(algorithm), cp_(cp) {}
  int size() const override { return cp_.size(); }
  int rank() const override { return cp_.rank(); }
  void AllToAll(const Tensor& in, const Tensor& out) const override {
    cp_.AllToAll(in, out)->Wait();
  }
  // A send to the next rank and a receive from the previous one, in flight together (shifts
  // follow one another in order between the same two ranks, so one tag serves them all).
  std::function<void()> StartShift(const Tensor& send, const Tensor& recv) const override {
    constexpr int kTag = 0x72696e67;  // "ring"
    const int p = cp_.size(), r = cp_.rank();
    comm::WorkPtr sent = cp_.Send(send, (r + 1) % p, kTag);
    comm::WorkPtr received = cp_.Recv(recv, (r + p - 1) % p, kTag);
    return [sent, received] {
      received->Wait();
      sent->Wait();
    };
  }

 private:
  comm::Communicator& cp_;
};

// A CommContextGroup over `cp`, or null for no group (null) or a group of one.
inline std::shared_ptr<const nn::ContextGroup> MakeContextGroup(
    comm::Communicator* cp, nn::ContextAlgorithm algorithm = nn::ContextAlgorithm::kUlysses) {
  if (cp == nullptr || cp->size() == 1) return nullptr;
  return std::make_shared<const CommContextGroup>(*cp, algorithm);
}

}  // namespace ztrain
