#pragma once
// The Llama family — Hugging Face's LlamaForCausalLM, and MistralForCausalLM and
// Qwen2ForCausalLM, which differ from it by config alone — on the shared layers of
// nn/transformer.h: an embedding without positions, N pre-RMSNorm blocks with grouped-query
// attention (q, k and v packed, rotate-half RoPE with rope_theta and rope_scaling) and a
// SwiGLU MLP down(silu(gate(x)) * up(x)), a final RMSNorm and an LM head, tied or its own.
//
// Parameter names are Hugging Face's without the "model." prefix ("embed_tokens.weight",
// "layers.3.self_attn.q_proj.weight", "norm.weight"; the head "lm_head.weight"), so the
// Hugging Face adapter maps them by a prefix. Initialisation as transformers does it: normal
// std 0.02 (initializer_range) for every matrix and embedding, biases 0, norm weights 1.
// Weight decay as GPT-2: matrices and embeddings only.
#include <vector>

#include "core/config.h"
#include "nn/family.h"

namespace ztrain::nn {

ModelFamily LlamaFamily();
// The Hugging Face adapter (hf_llama.cc): config.json of LlamaForCausalLM, MistralForCausalLM
// and Qwen2ForCausalLM, and their tensor names.
HfFamily LlamaHfFamily();

// RoPE's inverse frequencies [head_dim / 2] for `model` (rope_theta, rope_scaling), computed
// in fp32 as transformers' rope initialisation does.
std::vector<float> RopeInverseFrequencies(const ModelConfig& model);

}  // namespace ztrain::nn
