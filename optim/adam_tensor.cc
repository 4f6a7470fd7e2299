// AdamStep on tensors: argument checks and the host path; the CUDA path is in
// optim/cuda/adam_cuda.cu (Note [Adam on tensors] in optim/adam.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/adam.h"
#include "optim/adam_kernels.h"
#include "optim/cuda/adam_cuda.h"

namespace ztrain::optim {
namespace {

using ::ztrain::detail::StrCat;

// bf16 gradients are widened this many elements at a time: a multiple of 16 (the pointer
// AdamStep gives the same bits split there) and big enough for its OpenMP split.
constexpr int64_t kHostChunk = int64_t{1} << 20;

std::string Describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return StrCat(DTypeName(t.dtype()), " with ", t.numel(), " elements on ", t.device().ToString());
}

// `t` must be defined, of one of `dtypes`, with param's element count and device.
void CheckLikeParam(const Tensor& t, const char* name, std::initializer_list<DType> dtypes,
                    const char* dtype_names, const Tensor& param) {
  const bool ok = t.defined() &&
                  std::find(dtypes.begin(), dtypes.end(), t.dtype()) != dtypes.end() &&
                  t.numel() == param.numel() && t.device() == param.device();
  ZTRAIN_CHECK(ok, "AdamStep: argument '", name, "' is ", Describe(t), "; expected ", dtype_names,
               " with ", param.numel(), " elements on ", param.device().ToString(), " (as param)");
}

void CheckArgs(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
               const Tensor& param_copy) {
  ZTRAIN_CHECK(param.defined() && param.dtype() == DType::kF32, "AdamStep: argument 'param' is ",
               Describe(param), "; expected the fp32 master parameters");
  CheckLikeParam(grad, "grad", {DType::kF32, DType::kBF16}, "fp32 or bf16", param);
  CheckLikeParam(m, "m", {DType::kF32}, "fp32", param);
  CheckLikeParam(v, "v", {DType::kF32}, "fp32", param);
  if (param_copy.defined()) {
    CheckLikeParam(param_copy, "param_copy", {DType::kBF16, DType::kF32}, "bf16 or fp32", param);
  }
}

void WriteCopy(const Tensor& param, const Tensor& copy) {
  if (!copy.defined() || copy.numel() == 0 || copy.data() == param.data()) return;
  if (copy.dtype() == DType::kF32) {
    std::memcpy(copy.data(), param.data(), param.nbytes());
  } else {
    ConvertFromFloat(param.data<const float>(), copy.data(), copy.dtype(), param.numel());
  }
}

void HostStep(const AdamStepArgs& args, const Tensor& param, const Tensor& grad, const Tensor& m,
              const Tensor& v) {
  float* p = param.data<float>();
  float* mp = m.data<float>();
  float* vp = v.data<float>();
  const int64_t n = param.numel();
  if (grad.dtype() == DType::kF32) {
    AdamStep(args, p, grad.data<const float>(), mp, vp, n);
    return;
  }
  std::vector<float> wide(std::min(n, kHostChunk));
  const auto* g = grad.data<const uint16_t>();
  for (int64_t begin = 0; begin < n; begin += kHostChunk) {
    const int64_t count = std::min(kHostChunk, n - begin);
    ConvertToFloat(g + begin, DType::kBF16, wide.data(), count);
    AdamStep(args, p + begin, wide.data(), mp + begin, vp + begin, count);
  }
}

}  // namespace

void AdamStep(kernels::Ops& ops, const AdamStepArgs& args, const Tensor& param, const Tensor& grad,
              const Tensor& m, const Tensor& v, const Tensor& param_copy) {
  const detail::AdamKernelArgs a = detail::KernelArgsFor(args);  // checks step
  CheckArgs(param, grad, m, v, param_copy);
  if (param.device().is_cpu()) {
    HostStep(args, param, grad, m, v);
    WriteCopy(param, param_copy);
    return;
  }
  detail::AdamStepCuda(ops, a, param, grad, m, v, param_copy);
}

}  // namespace ztrain::optim
