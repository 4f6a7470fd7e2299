#pragma once
// The widening adapter: how CpuOps runs bf16 and fp16 arguments through its fp32 kernels.
//
// Note [Widening adapter]: an op called with any 16-bit argument widens each 16-bit input into
// fp32 scratch (exactly), runs the fp32 kernel on fp32 views, and rounds each 16-bit output
// once, to nearest even, into the caller's tensor. An accumulated output (dweight, dbias,
// dwte, dwpe, AddInPlace's y, Gemm's c when beta != 0) is widened in, accumulated into by the
// fp32 kernel and rounded once. So a 16-bit call gives bitwise the fp32 kernel's result on the
// widened inputs, rounded: the same arithmetic, the same determinism. Arguments that are fp32
// already, not floating-point, or not on the host pass through untouched, so the fp32 kernel's
// own checks name what is wrong with them (ops.h's fixed-fp32 arguments are never widened); so
// do undefined ones (a frozen parameter's gradient, Note [Frozen parameters] in ops.h), which
// the fp32 kernel then skips. The caller's outputs are written only by Commit, after the
// kernel returned: a throwing op has written nothing. Elementwise ops and the row-wise
// softmax-cross-entropy go through in chunks (ForEachChunk) so that their scratch stays a few
// MiB; EmbeddingForward widens only the table rows it reads (embedding.cc); GEMMs with two
// bf16 operands skip the adapter (Note [bf16 GEMMs] in gemm_mixed.cc).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/convert.h"
#include "kernels/widening.h"

namespace ztrain::kernels::cpu {

// Whether any of the tensors is bf16 or fp16 (undefined tensors are not).
template <typename... T>
bool AnyHalf(const T&... t) {
  return (IsHalfType(t.dtype()) || ...);
}

// fp32 scratch that one CpuOps keeps between calls, so that the 16-bit path does not fault in
// fresh pages on every call: the k-th scratch tensor of a call reuses slot k, which grows to
// the largest request it has seen and is freed with the pool. One thread at a time.
class ScratchPool {
 public:
  float* Get(size_t slot, int64_t count);
  size_t bytes() const;

 private:
  struct Slot {
    std::unique_ptr<float[]> data;
    int64_t capacity = 0;
  };
  std::vector<Slot> slots_;
};

// One op call's adapter (Note [Widening adapter]; In, Out, InOut and Commit as
// kernels/widening.h says): 16-bit host tensors get fp32 views in `pool`. Scopes on one pool
// must not overlap.
class Widened final : public WideningAdapter {
 public:
  explicit Widened(ScratchPool& pool) : pool_(pool) {}

 private:
  bool NeedsScratch(const Tensor& t) const override;
  Tensor Scratch(const Tensor& t, size_t slot) override;
  void Convert(const Tensor& src, const Tensor& dst) override;

  ScratchPool& pool_;
};

// Elements an elementwise op widens per chunk: 4 MiB of fp32 per argument.
inline constexpr int64_t kChunkElements = int64_t{1} << 20;

// Runs fn(Widened&, begin, end) over [0, n) in consecutive ranges of at most `chunk` items,
// each range with its own adapter, committed when fn returns.
template <typename Fn>
void ForEachChunk(ScratchPool& pool, int64_t n, int64_t chunk, Fn&& fn) {
  for (int64_t begin = 0; begin < n; begin += chunk) {
    Widened w(pool);
    fn(w, begin, std::min(n, begin + chunk));
    w.Commit();
  }
}

// Elements [begin, end) of t (any shape) as a 1-D tensor.
inline Tensor FlatRange(const Tensor& t, int64_t begin, int64_t end) {
  return t.Flat(begin, {end - begin});
}

}  // namespace ztrain::kernels::cpu
