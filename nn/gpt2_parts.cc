#include "nn/gpt2_parts.h"

namespace ztrain::nn {
namespace {

ParamSpec Spec(std::string name, Shape shape, Init init, float std, bool decay) {
  ParamSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.init = init;
  s.init_std = std;
  s.weight_decay = decay;
  return s;
}

}  // namespace

ParamSpec Weight(std::string name, Shape shape, float std) {
  return Spec(std::move(name), std::move(shape), Init::kNormal, std, true);
}
ParamSpec Bias(std::string name, int64_t n) {
  return Spec(std::move(name), {n}, Init::kZeros, 0.0f, false);
}
ParamSpec NormWeight(std::string name, int64_t n) {
  return Spec(std::move(name), {n}, Init::kOnes, 0.0f, false);
}

Tensor SavedLayerNorm(LayerContext& ctx, const std::string& name, const Tensor& x,
                      const Tensor& weight, const Tensor& bias) {
  const int64_t n = x.size(0);
  const Tensor y = ctx.Save(name, ctx.dtype(), x.shape());
  ctx.ops().LayerNormForward(x, weight, bias, y, ctx.Save(name + ".mean", DType::kF32, {n}),
                             ctx.Save(name + ".rstd", DType::kF32, {n}));
  return y;
}

void SavedLayerNormBackward(LayerContext& ctx, const std::string& name, const Tensor& dy,
                            const Tensor& x, const Tensor& weight, const Tensor& dx,
                            const Tensor& dweight, const Tensor& dbias) {
  ctx.ops().LayerNormBackward(dy, x, weight, ctx.Saved(name + ".mean"),
                              ctx.Saved(name + ".rstd"), dx, dweight, dbias);
}

}  // namespace ztrain::nn
