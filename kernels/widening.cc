#include "kernels/widening.h"

namespace ztrain::kernels {

Tensor WideningAdapter::In(const Tensor& t) {
  if (!NeedsScratch(t)) return t;
  for (const auto& [caller, copy] : inputs_) {
    if (caller.data() == t.data() && caller.dtype() == t.dtype() && caller.numel() == t.numel()) {
      return copy.View(t.shape());
    }
  }
  Tensor copy = Scratch(t, next_slot_++);
  Convert(t, copy);
  inputs_.emplace_back(t, copy);
  return copy;
}

Tensor WideningAdapter::Out(const Tensor& t) {
  if (!NeedsScratch(t)) return t;
  Tensor scratch = Scratch(t, next_slot_++);
  outputs_.emplace_back(t, scratch);
  return scratch;
}

Tensor WideningAdapter::InOut(const Tensor& t) {
  if (!NeedsScratch(t)) return t;
  Tensor scratch = Scratch(t, next_slot_++);
  Convert(t, scratch);
  outputs_.emplace_back(t, scratch);
  return scratch;
}

void WideningAdapter::Commit() {
  for (const auto& [caller, scratch] : outputs_) Convert(scratch, caller);
  outputs_.clear();
}

}  // namespace ztrain::kernels
