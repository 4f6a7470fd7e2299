#pragma once
// Pieces of GPT-2's layers shared by nn/gpt2.cc and the tensor-parallel layers
// (parallel/tensor): GPT-2's parameter kinds and layernorm with its statistics saved for the
// backward.
#include <string>

#include "nn/layer.h"
#include "nn/layer_context.h"

namespace ztrain::nn {

// A matrix or embedding: normal(0, std), weight decay on.
ParamSpec Weight(std::string name, Shape shape, float std = 0.02f);
// A bias: zeros, no weight decay.
ParamSpec Bias(std::string name, int64_t n);
// A layernorm weight: ones, no weight decay.
ParamSpec NormWeight(std::string name, int64_t n);

// LayerNorm of x [N, C] into a saved activation `name`, saving `name`.mean and `name`.rstd
// for the backward.
Tensor SavedLayerNorm(LayerContext& ctx, const std::string& name, const Tensor& x,
                      const Tensor& weight, const Tensor& bias);
// Backward of SavedLayerNorm: dx (overwritten) from dy; parameter gradients accumulate.
void SavedLayerNormBackward(LayerContext& ctx, const std::string& name, const Tensor& dy,
                            const Tensor& x, const Tensor& weight, const Tensor& dx,
                            const Tensor& dweight, const Tensor& dbias);

}  // namespace ztrain::nn
