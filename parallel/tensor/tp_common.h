#pragma once
// Internals shared by the tensor-parallel layers: parameter slices, the divisibility checks,
// and the few host loops the op set has no op for (GPT-2's parameter kinds and saved
// layernorm come from nn/gpt2_parts.h). Not part of the public API.
#include <string>

#include "nn/gpt2_parts.h"
#include "nn/layer.h"
#include "parallel/comm/communicator.h"

namespace ztrain::tensor::detail {

// Elements below which a host loop runs on one thread (as the CPU kernels do).
inline constexpr int64_t kParallelGrain = int64_t{1} << 15;

// GPT-2's parameter kinds and saved layernorm, as nn/gpt2.cc uses them.
using nn::Bias;
using nn::NormWeight;
using nn::SavedLayerNorm;
using nn::SavedLayerNormBackward;
using nn::Weight;

// `spec` (declared with its whole shape) cut into tp.size() pieces along `dim`, `groups`
// blocks each (nn::TensorSlice): shape becomes this rank's local shape. Whole when the
// group has one rank.
nn::ParamSpec Split(nn::ParamSpec spec, int dim, int groups, const comm::Communicator& tp);

// "<key> <value> does not divide by tensor_parallel.size <P>; <fix>" when value % tp_size != 0,
// else "". CheckDivides throws that message as a ConfigError.
std::string DivisibilityProblem(const char* key, int64_t value, int tp_size, const char* fix);
void CheckDivides(const char* key, int64_t value, int tp_size, const char* fix);

// The host loops below read and write tensor memory directly: refuse other devices with a
// message naming the layer.
void CheckHostOps(const nn::LayerContext& ctx, const std::string& layer);

// y[n, c] += bias[c] + residual[n, c]: the tail of a row-parallel linear after its all-reduce.
void AddBiasAndResidual(const Tensor& y, const Tensor& bias, const Tensor& residual);

// Issues `dx = dy @ weight` (the input gradient of a linear), starts its all-reduce over
// `tp`, then accumulates dweight (+= dy^T x) and dbias while the all-reduce runs, and waits.
// The backward of Megatron's f operator fused with the linear it guards.
void LinearBackwardAllReduceDx(nn::LayerContext& ctx, comm::Communicator& tp, const Tensor& dy,
                               const Tensor& x, const Tensor& weight, const Tensor& dx,
                               const Tensor& dweight, const Tensor& dbias);

}  // namespace ztrain::tensor::detail
