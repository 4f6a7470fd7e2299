#pragma once
// Internals shared by MegatronLinears' parts (megatron_*.cc): the few host loops the op set
// has no op for. Not part of the public API.
//
// Note [Tensor parallelism in 16 bits]
// Under bf16/fp16 the split layers compute as the whole ones do: activations and their gradients in
// the context's dtype D, parameters the engine's D copies, gradients in the engine's
// accumulation dtype, and every op computing in fp32 and rounding once. What crosses the tp
// group is fp32: a row-parallel linear's partial sums, the input gradient partial sums of f,
// and the embedding's looked-up rows are computed into an fp32 buffer (Fp32Partial), summed
// over the group in fp32, and rounded once into D together with what follows the sum (bias
// and residual, position embedding). So the sum is rounded once, as the single-process
// linear's output is, rather than once per rank. It moves twice the bytes of the D all-reduce
// Megatron uses (which rounds each rank's part first); ztrain's MPI reductions are fp32 anyway.
// The host loops read and write D values through LoadElements/StoreElements, in fp32.
#include <string>

#include "core/buffer.h"
#include "nn/layer.h"
#include "parallel/comm/communicator.h"

namespace ztrain::tensor::detail {

// Elements below which a host loop runs on one thread (as the CPU kernels do).
inline constexpr int64_t kParallelGrain = int64_t{1} << 15;

// The host loops below read and write tensor memory directly: refuse other devices with a
// message naming the layer.
void CheckHostOps(const nn::LayerContext& ctx, const std::string& layer);

// Elements [begin, begin + count) of a host tensor of any float dtype, widened into out.
void LoadElements(const Tensor& t, int64_t begin, int64_t count, float* out);
// in[0, count) rounded into elements [begin, begin + count) of a host tensor of any float
// dtype.
void StoreElements(const float* in, const Tensor& t, int64_t begin, int64_t count);

// Where a sum over the tp group that ends in `out` is computed and all-reduced (Note [Tensor
// parallelism in 16 bits]): `out` itself when it is fp32, else an fp32 tensor of its shape
// in `hold` (workspace from ctx's allocator, freed with `hold`).
Tensor Fp32Partial(const nn::LayerContext& ctx, const Tensor& out, Buffer& hold);

// y[n, c] = sum[n, c] + (bias[c] + residual[n, c]), rounded once into y's dtype: the tail of
// a row-parallel linear after its all-reduce. sum is fp32 and may be y itself; bias may be
// undefined (no bias).
void AddBiasAndResidual(const Tensor& sum, const Tensor& bias, const Tensor& residual,
                        const Tensor& y);

}  // namespace ztrain::tensor::detail
