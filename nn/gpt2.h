#pragma once
// The GPT-2 family (llm.c's GPT-2 and Hugging Face's GPT2LMHeadModel) on the shared layers of
// nn/transformer.h: Embedding with a learned position table, N pre-LayerNorm blocks with one
// fused c_attn (q, k and v of n_head heads) and a GELU MLP 4x wide, final LayerNorm and an LM
// head tied to the token embedding.
//
// Parameter names follow Hugging Face's GPT-2 without the "transformer." prefix ("wte",
// "h.3.attn.c_attn.weight", "ln_f.bias") so exports and llm.c's file order map by name.
// Linear weights are stored [out, in] as llm.c stores them. GPT-2 initialisation: normal
// std 0.02, residual projections (attn.c_proj, mlp.c_proj) 0.02/sqrt(2*n_layer), biases 0,
// layernorm weights 1. Weight decay applies to matrices and embeddings, not to biases or
// layernorm parameters (Megatron's and nanoGPT's grouping).
#include <memory>
#include <vector>

#include "core/config.h"
#include "nn/family.h"

namespace ztrain::nn {

// The family's registry entry (nn/family.cc).
ModelFamily Gpt2Family();

// GPT-2's layers one by one, for code that assembles its own model (examples/custom_layer).
std::unique_ptr<Layer> Gpt2Embedding(const ModelConfig& model,
                                     std::shared_ptr<const LinearProvider> provider);
std::unique_ptr<Layer> Gpt2Block(const ModelConfig& model, int index,
                                 std::shared_ptr<const LinearProvider> provider);
std::unique_ptr<Layer> Gpt2Head(const ModelConfig& model,
                                std::shared_ptr<const LinearProvider> provider);

// The whole single-process model: BuildModel for model.type "gpt2".
LayerList BuildGpt2(const ModelConfig& model);

// The Hugging Face adapter (hf_gpt2.cc): GPT2LMHeadModel's config.json and tensors.
HfFamily Gpt2HfFamily();
std::vector<HfTensor> HfGpt2Layout(const ModelConfig& model);

}  // namespace ztrain::nn
