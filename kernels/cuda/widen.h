#pragma once
// Mixed dtypes on the GPU: which calls the CUDA kernels take as they are, and the widening
// adapter that runs every other combination through the fp32 kernels.
//
// Note [Mixed dtypes on CUDA]: ops.h lets every floating-point argument be fp32, bf16 or fp16
// independently. The kernels are templated on one element type, so a call runs them directly
// ("native") when its floating-point tensors share one dtype, apart from the ones ops.h fixes
// as fp32 (statistics, lse, inv_freq, losses), and apart from accumulated parameter gradients
// (dweight, dbias, dwte, dwpe), which may also be fp32 over 16-bit inputs: mixed precision's
// layout, 16-bit activations and weights with fp32 gradients (data_types.grad_accum_dtype), so
// the training step's GEMMs run on 16-bit tensor cores and write fp32 (cublasGemmEx's 16-bit A
// and B with an fp32 C) and the norms', biases' and embedding tables' gradient sums store fp32
// (DispatchGrad). Gemm's c may be fp32 over 16-bit a and b in the same way, and so may the
// embedding's output (the fp32 partial of a vocabulary-parallel lookup).
//
// Every other combination goes through the widening adapter, as CpuOps does (Note [Widening
// adapter] in kernels/cpu/widen.h): each 16-bit device argument is widened into fp32 device
// scratch (exactly), the fp32 kernel runs on fp32 views, and each 16-bit output is rounded once,
// to nearest even, into the caller's tensor (Copy's conversion kernel); an accumulated output is
// widened in first. So every call gives the fp32 kernel's result on the widened inputs,
// rounded once: a native 16-bit kernel computes in fp32 and rounds each output once too, so
// both paths give the same values, the adapter with more memory traffic. The scratch is the
// ops object's (DeviceScratch), reused from call to call in stream order and counted by
// ScratchBytes. Undefined tensors (frozen gradients), non-float ones and tensors not on the
// device pass through untouched, so the fp32 kernel's checks name what is wrong with them.
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <vector>

#include "core/tensor.h"
#include "kernels/widening.h"

namespace ztrain::kernels::cuda {

class CudaOps;

// Device buffers one CudaOps keeps for the widening adapter: the k-th scratch tensor of a
// call reuses slot k, grown (stream-ordered) to the largest request seen. One thread at a time.
class DeviceScratch {
 public:
  DeviceScratch() = default;
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  // At least `bytes` of device memory in slot `slot`, valid until the slot is asked again.
  void* Get(size_t slot, size_t bytes, cudaStream_t stream);
  size_t bytes() const;
  // Frees every slot on `stream` (errors ignored: called from destructors).
  void Free(cudaStream_t stream) noexcept;

 private:
  struct Slot {
    void* data = nullptr;
    size_t capacity = 0;
  };
  std::vector<Slot> slots_;
};

using TensorRefs = std::initializer_list<std::reference_wrapper<const Tensor>>;

// Whether a call goes through the widening adapter (Note [Mixed dtypes on CUDA]): every defined
// tensor of `same` and `grads` is floating-point (else the kernels' checks name the one that is
// not), and either the defined ones of `same` differ in dtype or a defined one of `grads` has
// neither their dtype nor fp32.
bool NeedsWidening(TensorRefs same, TensorRefs grads = {});

// One op call's adapter (In, Out, InOut and Commit as kernels/widening.h says): 16-bit tensors
// on the ops' device get fp32 views in its DeviceScratch, converted by its Copy (stream-ordered).
// Scopes on one ops object must not overlap.
class Widened final : public WideningAdapter {
 public:
  explicit Widened(CudaOps& ops) : ops_(ops) {}

 private:
  bool NeedsScratch(const Tensor& t) const override;
  Tensor Scratch(const Tensor& t, size_t slot) override;
  void Convert(const Tensor& src, const Tensor& dst) override;

  CudaOps& ops_;
};

}  // namespace ztrain::kernels::cuda
