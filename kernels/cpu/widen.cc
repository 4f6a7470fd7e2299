#include "kernels/cpu/widen.h"

namespace ztrain::kernels::cpu {

float* ScratchPool::Get(size_t slot, int64_t count) {
  if (slot >= slots_.size()) slots_.resize(slot + 1);
  Slot& s = slots_[slot];
  if (s.capacity < count) {
    s.data.reset();  // free first: the old and the new block need not coexist
    s.data = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(count));
    s.capacity = count;
  }
  return s.data.get();
}

size_t ScratchPool::bytes() const {
  size_t total = 0;
  for (const Slot& s : slots_) total += static_cast<size_t>(s.capacity) * sizeof(float);
  return total;
}

bool Widened::NeedsScratch(const Tensor& t) {
  return t.defined() && t.device().is_cpu() && IsHalfType(t.dtype());
}

Tensor Widened::Scratch(const Tensor& t) {
  return Tensor(pool_.Get(next_slot_++, t.numel()), DType::kF32, t.shape());
}

Tensor Widened::In(const Tensor& t) {
  if (!NeedsScratch(t)) return t;
  for (const auto& [caller, copy] : inputs_) {
    if (caller.data() == t.data() && caller.dtype() == t.dtype() && caller.numel() == t.numel()) {
      return copy.View(t.shape());
    }
  }
  Tensor copy = Scratch(t);
  Widen(t.data(), t.dtype(), copy.data<float>(), t.numel());
  inputs_.emplace_back(t, copy);
  return copy;
}

Tensor Widened::Out(const Tensor& t) {
  if (!NeedsScratch(t)) return t;
  Tensor scratch = Scratch(t);
  outputs_.emplace_back(t, scratch);
  return scratch;
}

Tensor Widened::InOut(const Tensor& t) {
  if (!NeedsScratch(t)) return t;
  Tensor scratch = Scratch(t);
  Widen(t.data(), t.dtype(), scratch.data<float>(), t.numel());
  outputs_.emplace_back(t, scratch);
  return scratch;
}

void Widened::Commit() {
  for (const auto& [caller, scratch] : outputs_) {
    Narrow(scratch.data<float>(), caller.data(), caller.dtype(), caller.numel());
  }
  outputs_.clear();
}

}  // namespace ztrain::kernels::cpu
