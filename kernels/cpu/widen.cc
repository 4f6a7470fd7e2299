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

bool Widened::NeedsScratch(const Tensor& t) const {
  return t.defined() && t.device().is_cpu() && IsHalfType(t.dtype());
}

Tensor Widened::Scratch(const Tensor& t, size_t slot) {
  return Tensor(pool_.Get(slot, t.numel()), DType::kF32, t.shape());
}

void Widened::Convert(const Tensor& src, const Tensor& dst) {
  if (dst.dtype() == DType::kF32) {
    Widen(src.data(), src.dtype(), dst.data<float>(), src.numel());
  } else {
    Narrow(src.data<float>(), dst.data(), dst.dtype(), src.numel());
  }
}

}  // namespace ztrain::kernels::cpu
