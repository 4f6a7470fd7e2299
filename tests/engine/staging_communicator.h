#pragma once
// A communicator for device tensors over one that moves host memory (MPI), for tests only:
// every op copies its tensors into host buffers of its own, runs the inner op on them, and
// copies what the op wrote back when its Work finishes (Wait, or Done answering true). It
// lets ranks that share one GPU run the CUDA backend's layouts against the CPU on a machine
// with a single GPU, where NCCL (the product's CUDA communicator) refuses two ranks on one
// device. Host tensors are staged the same way, so a CPU run through it checks the staging
// itself (its buffers, in-place chunks and deferred copies). Test code: it includes
// cuda_runtime.h when the build has CUDA (ZTRAIN_TEST_HAVE_CUDA).
//
// Device memory is read with a synchronous cudaMemcpy on the legacy default stream, which
// waits for the CUDA ops' (blocking) stream, and written back the same way before Wait
// returns, so later ops see it. Send/Recv stay asynchronous (a pipeline's sends and receives
// may be in flight together), as the Communicator contract requires.
#if ZTRAIN_TEST_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "parallel/comm/communicator.h"

namespace ztrain::testing {

// src's bytes into dst (the same size; either may be device memory).
inline void CopyBytes(const Tensor& src, const Tensor& dst) {
  ZTRAIN_ASSERT(src.nbytes() == dst.nbytes(), "staging copies equal sizes");
  if (src.nbytes() == 0) return;
  if (src.device().is_cpu() && dst.device().is_cpu()) {
    std::memmove(dst.data(), src.data(), src.nbytes());
    return;
  }
#if ZTRAIN_TEST_HAVE_CUDA
  const cudaError_t e = cudaMemcpy(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault);
  ZTRAIN_CHECK(e == cudaSuccess, "staging communicator: cudaMemcpy failed: ",
               cudaGetErrorString(e));
#else
  ZTRAIN_CHECK(false, "staging communicator: a device tensor in a build without CUDA");
#endif
}

class StagingCommunicator final : public comm::Communicator {
 public:
  // Wraps `inner` (not owned: the world, which outlives this).
  explicit StagingCommunicator(comm::Communicator& inner) : inner_(inner) {}
  explicit StagingCommunicator(std::unique_ptr<comm::Communicator> owned)
      : owned_(std::move(owned)), inner_(*owned_) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name() + " (staged through the host)"; }
  void set_label(const std::string& label) override { inner_.set_label(label); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  void set_timeout(std::chrono::milliseconds t) override { inner_.set_timeout(t); }
  comm::CommStats stats() const override { return inner_.stats(); }

  comm::WorkPtr AllReduce(const Tensor& t, comm::ReduceOp op) override {
    auto s = std::make_shared<Staged>();
    const Tensor h = s->Stage(t, true);
    s->Back(h, t);
    return s->Run(inner_.AllReduce(h, op));
  }
  comm::WorkPtr ReduceScatter(const Tensor& in, const Tensor& out, comm::ReduceOp op) override {
    auto s = std::make_shared<Staged>();
    const Tensor hin = s->Stage(in, true);
    const std::unique_ptr<Tensor> chunk = Chunk(in, hin, out);
    const Tensor hout = chunk ? *chunk : s->Stage(out, false);
    s->Back(hout, out);
    return s->Run(inner_.ReduceScatter(hin, hout, op));
  }
  comm::WorkPtr AllGather(const Tensor& in, const Tensor& out) override {
    auto s = std::make_shared<Staged>();
    const Tensor hout = s->Stage(out, true);
    const std::unique_ptr<Tensor> chunk = Chunk(out, hout, in);
    const Tensor hin = chunk ? *chunk : s->Stage(in, true);
    s->Back(hout, out);
    return s->Run(inner_.AllGather(hin, hout));
  }
  comm::WorkPtr AllToAll(const Tensor& in, const Tensor& out) override {
    auto s = std::make_shared<Staged>();
    const Tensor hin = s->Stage(in, true);
    const Tensor hout = s->Stage(out, false);
    s->Back(hout, out);
    return s->Run(inner_.AllToAll(hin, hout));
  }
  comm::WorkPtr Broadcast(const Tensor& t, int root) override {
    auto s = std::make_shared<Staged>();
    const Tensor h = s->Stage(t, true);
    s->Back(h, t);
    return s->Run(inner_.Broadcast(h, root));
  }
  comm::WorkPtr Send(const Tensor& t, int peer, int tag) override {
    auto s = std::make_shared<Staged>();
    return s->Run(inner_.Send(s->Stage(t, true), peer, tag));
  }
  comm::WorkPtr Recv(const Tensor& t, int peer, int tag) override {
    auto s = std::make_shared<Staged>();
    const Tensor h = s->Stage(t, false);
    s->Back(h, t);
    return s->Run(inner_.Recv(h, peer, tag));
  }
  comm::WorkPtr Barrier() override { return inner_.Barrier(); }
  std::unique_ptr<comm::Communicator> Split(int color, int key) override {
    return std::make_unique<StagingCommunicator>(inner_.Split(color, key));
  }

 private:
  // One op's host buffers and the copies back, finished once.
  class Staged final : public comm::Work, public std::enable_shared_from_this<Staged> {
   public:
    Tensor Stage(const Tensor& t, bool copy_in) {
      buffers_.emplace_back(static_cast<size_t>(t.nbytes()) + 1);
      const Tensor h(buffers_.back().data(), t.dtype(), t.shape());
      if (copy_in) CopyBytes(t, h);
      return h;
    }
    void Back(const Tensor& host, const Tensor& target) { back_.emplace_back(host, target); }
    comm::WorkPtr Run(comm::WorkPtr inner) {
      inner_ = std::move(inner);
      return shared_from_this();
    }
    void Wait() override {
      inner_->Wait();
      Finish();
    }
    bool Done() override {
      if (!inner_->Done()) return false;
      Finish();
      return true;
    }

   private:
    void Finish() {
      if (finished_) return;
      finished_ = true;
      for (const auto& [host, target] : back_) CopyBytes(host, target);
    }
    std::vector<std::vector<uint8_t>> buffers_;  // a vector of vectors: data() stays put
    std::vector<std::pair<Tensor, Tensor>> back_;
    comm::WorkPtr inner_;
    bool finished_ = false;
  };

  // When `part` is chunk rank() of `whole` (an in-place ReduceScatter or AllGather), the same
  // chunk of `whole`'s host copy; else nothing.
  std::unique_ptr<Tensor> Chunk(const Tensor& whole, const Tensor& host_whole,
                                const Tensor& part) const {
    const int64_t bytes = part.nbytes();
    if (static_cast<const char*>(part.data()) !=
        static_cast<const char*>(whole.data()) + bytes * rank()) {
      return nullptr;
    }
    return std::make_unique<Tensor>(static_cast<char*>(host_whole.data()) + bytes * rank(),
                                    part.dtype(), part.shape());
  }

  std::unique_ptr<comm::Communicator> owned_;
  comm::Communicator& inner_;
};

}  // namespace ztrain::testing
