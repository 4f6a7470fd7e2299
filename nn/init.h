#pragma once
// Deterministic parameter initialisation (DESIGN.md "Flat parameters").
//
// Element i of parameter `name` depends only on (seed, name, i): a counter-based hash, no
// sequential RNG state. So any layout — a whole layer, a dp shard, a pipeline stage — that
// initialises the elements it holds gets exactly the single-process values. Thread safe.
#include <cstdint>
#include <string_view>

#include "core/tensor.h"
#include "nn/layer.h"

namespace ztrain::nn {

// A standard normal sample for element `index` of the stream keyed by (seed, name).
double InitNormal(uint64_t seed, std::string_view name, int64_t index);

// Fills `out` (fp32) with elements [offset, offset + out.numel()) of parameter `spec`:
// zeros, ones, normal(0, spec.init_std), or uniform in [-spec.init_std, spec.init_std).
void InitParam(const ParamSpec& spec, uint64_t seed, const Tensor& out, int64_t offset = 0);

}  // namespace ztrain::nn
