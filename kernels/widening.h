#pragma once
// The widening adapter's bookkeeping, shared by the backends: one op call's fp32 views of its
// 16-bit arguments (Note [Widening adapter] in kernels/cpu/widen.h; Note [Mixed dtypes on
// CUDA] in kernels/cuda/widen.h). A backend says which tensors need a view, where the fp32
// scratch comes from and how values convert; this class keeps the inputs' copies (one per
// tensor, however often it is asked for) and the outputs to round back.
#include <cstddef>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ztrain::kernels {

class WideningAdapter {
 public:
  WideningAdapter(const WideningAdapter&) = delete;
  WideningAdapter& operator=(const WideningAdapter&) = delete;

  // An fp32 view of an input: t itself unless NeedsScratch(t), else its widened copy (the same
  // copy when the same tensor is asked for twice).
  Tensor In(const Tensor& t);
  // An fp32 view of an output the kernel overwrites; Commit rounds it into t.
  Tensor Out(const Tensor& t);
  // An fp32 view of an output the kernel reads and accumulates into; Commit rounds it into t.
  Tensor InOut(const Tensor& t);
  // Rounds every Out/InOut view into its tensor. Call once, after the kernel ran (or was
  // enqueued).
  void Commit();

 protected:
  WideningAdapter() = default;
  ~WideningAdapter() = default;

  // Whether t gets an fp32 view (a 16-bit tensor of the backend's memory).
  virtual bool NeedsScratch(const Tensor& t) const = 0;
  // fp32 scratch of t's shape: the call's slot-th (slots are numbered from 0 in each call).
  virtual Tensor Scratch(const Tensor& t, size_t slot) = 0;
  // dst = src between two float dtypes: exact when widening, rounded once when narrowing.
  virtual void Convert(const Tensor& src, const Tensor& dst) = 0;

 private:
  size_t next_slot_ = 0;
  std::vector<std::pair<Tensor, Tensor>> inputs_;   // (caller's tensor, fp32 copy)
  std::vector<std::pair<Tensor, Tensor>> outputs_;  // (caller's tensor, fp32 scratch)
};

}  // namespace ztrain::kernels
