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
// layernorm weights 1. Weight decay is the parameter groups' (Note [Parameter groups],
// optim/param_groups.h): by default matrices and embeddings, not biases or layernorm weights.
#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"
#include "nn/family.h"

namespace ztrain::nn {

// Note [Family name tables]
// Each family's tensor names live in one table, which its builder, its Hugging Face adapter
// (names, and which weights HF stores transposed), its other file formats (llm.c's order)
// and LoRA's default targets all read; nothing else spells them (llama.cpp keeps one such
// table per architecture). ztrain's names are Hugging Face's without the model's prefix.
struct Gpt2Names {
  static constexpr std::string_view kTokens = "wte", kPositions = "wpe";
  static constexpr std::string_view kFinalNorm = "ln_f", kHead = "lm_head.weight";
  static constexpr std::string_view kNorm1 = "ln_1", kQkv = "attn.c_attn", kAttnOut = "attn.c_proj",
                                    kNorm2 = "ln_2", kMlpUp = "mlp.c_fc", kMlpDown = "mlp.c_proj";
  // A block's modules in the order of its parameters (each weight, then bias): HF's
  // state_dict order and llm.c's per-block order.
  static constexpr std::array<std::string_view, 6> kBlockModules = {kNorm1, kQkv,   kAttnOut,
                                                                    kNorm2, kMlpUp, kMlpDown};
  // The modules Hugging Face's GPT-2 keeps as Conv1D, weights [in, out].
  static constexpr std::array<std::string_view, 4> kConv1d = {kQkv, kAttnOut, kMlpUp, kMlpDown};
  static constexpr std::string_view kHfPrefix = "transformer.";
  // HF's name of an embedding ztrain names bare ("wte" is "transformer.wte.weight").
  static constexpr std::string_view kHfEmbeddingSuffix = ".weight";
  static constexpr std::array<std::string_view, 1> kLoraTargets = {"c_attn"};
  static std::string Block(int index) { return "h." + std::to_string(index) + "."; }
};

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
