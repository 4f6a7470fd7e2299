#include "nn/gpt2.h"

#include <cmath>

#include "nn/transformer.h"

namespace ztrain::nn {

std::unique_ptr<Layer> Gpt2Embedding(const ModelConfig& m,
                                     std::shared_ptr<const LinearProvider> provider) {
  return std::make_unique<Embedding>(
      EmbeddingSpec{m.padded_vocab_size, m.n_embd, m.max_seq_len, "wte", "wpe"},
      std::move(provider));
}

std::unique_ptr<Layer> Gpt2Block(const ModelConfig& m, int index,
                                 std::shared_ptr<const LinearProvider> provider) {
  ZTRAIN_CHECK(m.n_head > 0 && m.n_embd % m.n_head == 0, "model.n_embd (", m.n_embd,
               ") must be divisible by model.n_head (", m.n_head, ")");
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(m.n_layer));
  BlockSpec s;
  s.prefix = "h." + std::to_string(index) + ".";
  s.index = index;
  s.channels = m.n_embd;
  s.norm = {NormKind::kLayerNorm, 1e-5f};
  s.norm1 = "ln_1";
  s.norm2 = "ln_2";
  s.attention.n_head = s.attention.n_kv_head = m.n_head;
  s.attention.head_dim = m.n_embd / m.n_head;
  s.attention.qkv = "attn.c_attn";
  s.attention.o = "attn.c_proj";
  s.attention.qkv_bias = s.attention.o_bias = true;
  s.attention.o_std = proj_std;
  s.mlp = {MlpKind::kGelu, 4 * int64_t{m.n_embd}, "", "mlp.c_fc", "mlp.c_proj", true, proj_std};
  return std::make_unique<TransformerBlock>(s, std::move(provider));
}

std::unique_ptr<Layer> Gpt2Head(const ModelConfig& m,
                                std::shared_ptr<const LinearProvider> provider) {
  HeadSpec s{m.vocab_size, m.padded_vocab_size, m.n_embd, {NormKind::kLayerNorm, 1e-5f},
             "ln_f", "lm_head.weight", "wte"};
  return std::make_unique<LmHead>(s, std::move(provider));
}

namespace {

LayerList Build(const ModelConfig& m, std::shared_ptr<const LinearProvider> provider) {
  LayerList layers;
  layers.push_back(Gpt2Embedding(m, provider));
  for (int l = 0; l < m.n_layer; ++l) layers.push_back(Gpt2Block(m, l, provider));
  layers.push_back(Gpt2Head(m, provider));
  return layers;
}

// Heads split whole over the tp pieces (the MLP's 4C and the channels then split too).
std::vector<std::string> TensorParallelProblems(const ModelConfig& m, int tp) {
  return {HeadSplitProblem("model.n_head", m.n_head, tp)};
}

}  // namespace

ModelFamily Gpt2Family() {
  return {"gpt2", "GPT-2 (llm.c's files, Hugging Face GPT2LMHeadModel)", &Build,
          &TensorParallelProblems};
}

LayerList BuildGpt2(const ModelConfig& model) { return BuildModel(model); }

}  // namespace ztrain::nn
