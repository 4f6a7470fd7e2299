#pragma once
// Internals shared by MegatronLinears' parts (megatron_*.cc). Not part of the public API.
//
// Note [Tensor parallelism in 16 bits]
// Under bf16/fp16 the split layers compute as the whole ones do: activations and their gradients in
// the context's dtype D, parameters the engine's D copies, gradients in the engine's
// accumulation dtype, and every op computing in fp32 and rounding once. What crosses the tp
// group is fp32: a row-parallel linear's partial sums, the input gradient partial sums of f,
// and the embedding's looked-up rows are computed into an fp32 buffer (Fp32Partial), summed
// over the group in fp32, and rounded once into D together with what follows the sum (bias
// and residual, position embedding: Ops::AddBiasAndResidual). So the sum is rounded once, as
// the single-process linear's output is, rather than once per rank. It moves twice the bytes
// of the D all-reduce Megatron uses (which rounds each rank's part first); ztrain's MPI
// reductions are fp32 anyway. Every step is an op (kernels/ops.h: the vocabulary slices of
// EmbeddingForward/Backward, AddBiasAndResidual, VocabParallelCrossEntropy), so the layers run
// on any backend, their collectives on the tp group's communicator (NCCL on CUDA).
#include "core/buffer.h"
#include "nn/layer.h"
#include "parallel/comm/communicator.h"

namespace ztrain::tensor::detail {

// Where a sum over the tp group that ends in `out` is computed and all-reduced (Note [Tensor
// parallelism in 16 bits]): `out` itself when it is fp32, else an fp32 tensor of its shape
// in `hold` (workspace from ctx's allocator, freed with `hold`).
Tensor Fp32Partial(const nn::LayerContext& ctx, const Tensor& out, Buffer& hold);

}  // namespace ztrain::tensor::detail
