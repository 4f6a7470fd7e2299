#include "kernels/cuda/widen.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"

namespace ztrain::kernels::cuda {
namespace {

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }
bool IsHalf(DType t) { return t == DType::kBF16 || t == DType::kF16; }

}  // namespace

void* DeviceScratch::Get(size_t slot, size_t bytes, cudaStream_t stream) {
  if (slots_.size() <= slot) slots_.resize(slot + 1);
  Slot& s = slots_[slot];
  if (s.capacity < bytes) {
    if (s.data != nullptr) ZTRAIN_CUDA_CHECK(cudaFreeAsync(s.data, stream));
    s = {};
    ZTRAIN_CUDA_CHECK(cudaMallocAsync(&s.data, bytes, stream));
    s.capacity = bytes;
  }
  return s.data;
}

size_t DeviceScratch::bytes() const {
  size_t total = 0;
  for (const Slot& s : slots_) total += s.capacity;
  return total;
}

void DeviceScratch::Free(cudaStream_t stream) noexcept {
  for (Slot& s : slots_) {
    if (s.data != nullptr) cudaFreeAsync(s.data, stream);
  }
  slots_.clear();
}

bool NeedsWidening(TensorRefs same, TensorRefs grads) {
  bool have = false, differ = false;
  DType first = DType::kF32;
  for (const Tensor& t : same) {
    if (!t.defined()) continue;
    if (!IsFloat(t.dtype())) return false;
    if (!have) first = t.dtype();
    differ = differ || t.dtype() != first;
    have = true;
  }
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    if (!IsFloat(g.dtype())) return false;
    differ = differ || (have && g.dtype() != first && g.dtype() != DType::kF32);
  }
  return differ;
}

bool Widened::NeedsScratch(const Tensor& t) const {
  return t.defined() && t.device() == ops_.device() && IsHalf(t.dtype());
}

Tensor Widened::Scratch(const Tensor& t, size_t slot) {
  // At least one element: an empty tensor's view must still be defined (non-null), or the
  // kernel would take it for a missing argument.
  const size_t elements = std::max<size_t>(static_cast<size_t>(t.numel()), 1);
  void* data = ops_.scratch().Get(slot, sizeof(float) * elements, ops_.stream());
  return Tensor(data, DType::kF32, t.shape(), ops_.device());
}

void Widened::Convert(const Tensor& src, const Tensor& dst) { ops_.Copy(src, dst); }

}  // namespace ztrain::kernels::cuda
