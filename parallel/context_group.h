#pragma once
// The cp group of a context-parallel layout as the nn::ContextGroup attention exchanges heads
// over (Note [Context parallelism], nn/context_parallel.h).
#include <memory>

#include "nn/context_parallel.h"
#include "parallel/comm/communicator.h"

namespace ztrain {

// Holds a reference to `cp`, which must outlive it (and every layer built with it).
class CommContextGroup final : public nn::ContextGroup {
 public:
  explicit CommContextGroup(comm::Communicator& cp) : cp_(cp) {}
  int size() const override { return cp_.size(); }
  int rank() const override { return cp_.rank(); }
  void AllToAll(const Tensor& in, const Tensor& out) const override {
    cp_.AllToAll(in, out)->Wait();
  }

 private:
  comm::Communicator& cp_;
};

// A CommContextGroup over `cp`, or null for no group (null) or a group of one.
inline std::shared_ptr<const nn::ContextGroup> MakeContextGroup(comm::Communicator* cp) {
  if (cp == nullptr || cp->size() == 1) return nullptr;
  return std::make_shared<const CommContextGroup>(*cp);
}

}  // namespace ztrain
