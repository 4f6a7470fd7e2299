#include "nn/gpt2.h"

#include <cmath>

#include "nn/transformer.h"

namespace ztrain::nn {

std::unique_ptr<Layer> Gpt2Embedding(const ModelConfig& m,
                                     std::shared_ptr<const LinearProvider> provider) {
  return std::make_unique<Embedding>(
      EmbeddingSpec{m.padded_vocab_size, m.n_embd, m.max_seq_len, std::string(Gpt2Names::kTokens),
                    std::string(Gpt2Names::kPositions)},
      std::move(provider));
}

std::unique_ptr<Layer> Gpt2Block(const ModelConfig& m, int index,
                                 std::shared_ptr<const LinearProvider> provider) {
  ZTRAIN_CHECK(m.n_head > 0 && m.n_embd % m.n_head == 0, "model.n_embd (", m.n_embd,
               ") must be divisible by model.n_head (", m.n_head, ")");
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(m.n_layer));
  BlockSpec s;
  using N = Gpt2Names;
  s.prefix = N::Block(index);
  s.index = index;
  s.channels = m.n_embd;
  s.norm = {NormKind::kLayerNorm, 1e-5f};
  s.norm1 = N::kNorm1;
  s.norm2 = N::kNorm2;
  s.attention.n_head = s.attention.n_kv_head = m.n_head;
  s.attention.head_dim = m.n_embd / m.n_head;
  s.attention.qkv = N::kQkv;
  s.attention.o = N::kAttnOut;
  s.attention.qkv_bias = s.attention.o_bias = true;
  s.attention.o_std = proj_std;
  s.mlp = {MlpKind::kGelu,
           4 * int64_t{m.n_embd},
           "",
           std::string(N::kMlpUp),
           std::string(N::kMlpDown),
           true,
           proj_std};
  return std::make_unique<TransformerBlock>(s, std::move(provider));
}

std::unique_ptr<Layer> Gpt2Head(const ModelConfig& m,
                                std::shared_ptr<const LinearProvider> provider) {
  HeadSpec s{m.vocab_size,
             m.padded_vocab_size,
             m.n_embd,
             {NormKind::kLayerNorm, 1e-5f},
             std::string(Gpt2Names::kFinalNorm),
             std::string(Gpt2Names::kHead),
             std::string(Gpt2Names::kTokens)};
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

// Heads split whole over the tp pieces; the MLP's 4C and the residual projections split
// channels too.
std::vector<std::string> TensorParallelProblems(const ModelConfig& m, int tp) {
  return {HeadSplitProblem("model.n_head", m.n_head, tp),
          DivisibilityProblem("model.n_embd", m.n_embd, tp,
                              "use a tensor_parallel.size that divides it")};
}

// GPT-2's shape is fixed by n_layer, n_head and n_embd: the Llama knobs must keep their
// GPT-2 values.
std::vector<std::string> ConfigProblems(const ModelConfig& m) {
  std::vector<std::string> p;
  const auto refuse = [&](bool bad, const std::string& what) {
    if (bad) p.push_back(what + " is not GPT-2's; leave it out or use model.type \"llama\"");
  };
  refuse(m.kv_heads() != m.n_head,
         detail::StrCat("model.n_kv_head ", m.kv_heads(), " (GPT-2: n_head)"));
  refuse(m.n_head > 0 && m.head_size() != m.n_embd / m.n_head,
         detail::StrCat("model.head_dim ", m.head_size(), " (GPT-2: n_embd / n_head)"));
  refuse(m.mlp_hidden() != 4 * int64_t{m.n_embd},
         detail::StrCat("model.intermediate_size ", m.mlp_hidden(), " (GPT-2: 4 n_embd)"));
  refuse(m.norm_eps != 1e-5, detail::StrCat("model.norm_eps ", m.norm_eps, " (GPT-2: 1e-5)"));
  refuse(m.rope_scaling.type != "none", "model.rope_scaling (GPT-2 has learned positions)");
  refuse(m.rope_theta != 10000.0, "model.rope_theta (GPT-2 has learned positions)");
  refuse(m.attention_bias || m.qkv_bias || m.mlp_bias,
         "a model.*_bias flag (GPT-2 has every bias)");
  refuse(!m.tie_word_embeddings, "model.tie_word_embeddings false (GPT-2 ties them)");
  refuse(m.sliding_window != 0 || m.max_window_layers != 0,
         "model.sliding_window (GPT-2 attends to the whole context; the Llama family has "
         "windows)");
  return p;
}

}  // namespace

ModelFamily Gpt2Family() {
  return {"gpt2",
          "GPT-2 (llm.c's files, Hugging Face GPT2LMHeadModel)",
          &Build,
          &ConfigProblems,
          &TensorParallelProblems,
          Gpt2HfFamily(),
          {Gpt2Names::kLoraTargets.begin(), Gpt2Names::kLoraTargets.end()}};
}

LayerList BuildGpt2(const ModelConfig& model) { return BuildModel(model); }

}  // namespace ztrain::nn
