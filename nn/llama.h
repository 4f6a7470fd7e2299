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
// Weight decay as GPT-2: matrices and embeddings only (the default parameter groups).
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"
#include "nn/family.h"

namespace ztrain::nn {

// The family's tensor names (Note [Family name tables], nn/gpt2.h).
struct LlamaNames {
  static constexpr std::string_view kTokens = "embed_tokens.weight";
  static constexpr std::string_view kFinalNorm = "norm", kHead = "lm_head.weight";
  static constexpr std::string_view kNorm1 = "input_layernorm", kNorm2 = "post_attention_layernorm";
  static constexpr std::string_view kQ = "self_attn.q_proj", kK = "self_attn.k_proj",
                                    kV = "self_attn.v_proj", kO = "self_attn.o_proj";
  static constexpr std::string_view kGate = "mlp.gate_proj", kUp = "mlp.up_proj",
                                    kDown = "mlp.down_proj";
  // Hugging Face prefixes every name but the head's with this.
  static constexpr std::string_view kHfPrefix = "model.";
  static constexpr std::array<std::string_view, 2> kLoraTargets = {"q_proj", "v_proj"};
  static std::string Block(int index) { return "layers." + std::to_string(index) + "."; }
};

ModelFamily LlamaFamily();
// The Hugging Face adapter (hf_llama.cc): config.json of LlamaForCausalLM, MistralForCausalLM
// and Qwen2ForCausalLM, and their tensor names.
HfFamily LlamaHfFamily();

// RoPE's inverse frequencies [head_dim / 2] for `model` (rope_theta, rope_scaling), computed
// in fp32 as transformers' rope initialisation does (modeling_rope_utils.py). `seq_len` is the
// length of the sequence they turn (the highest position + 1): only `dynamic` depends on it,
// growing the base past original_max_position_embeddings; 0 means the initial frequencies.
std::vector<float> RopeInverseFrequencies(const ModelConfig& model, int64_t seq_len = 0);
// The factor transformers puts on cos and sin (its attention_scaling): YaRN's attention
// factor, 1 for every other type.
float RopeAttentionFactor(const RopeScalingConfig& scaling);

}  // namespace ztrain::nn
