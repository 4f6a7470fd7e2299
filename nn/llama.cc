#include "nn/llama.h"

#include <cmath>
#include <numbers>

#include "nn/transformer.h"

namespace ztrain::nn {
namespace {

// Llama 3.1's bands (transformers' _compute_llama3_parameters): wavelengths longer than
// original/low_freq_factor are slowed by `factor`, shorter than original/high_freq_factor kept,
// and those between interpolated smoothly.
float Llama3Frequency(float f, const RopeScalingConfig& s) {
  const float original = static_cast<float>(s.original_max_position_embeddings);
  const float factor = static_cast<float>(s.factor);
  const float low = static_cast<float>(s.low_freq_factor);
  const float high = static_cast<float>(s.high_freq_factor);
  const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
  if (wavelen < original / high) return f;
  if (wavelen > original / low) return f / factor;
  const float smooth = (original / wavelen - low) / (high - low);
  return (1.0f - smooth) * f / factor + smooth * f;
}

std::unique_ptr<Layer> Block(const ModelConfig& m, int index,
                             std::shared_ptr<const LinearProvider> provider,
                             const std::vector<float>& inv_freq) {
  BlockSpec s;
  using N = LlamaNames;
  s.prefix = N::Block(index);
  s.index = index;
  s.channels = m.n_embd;
  s.norm = {NormKind::kRmsNorm, static_cast<float>(m.norm_eps)};
  s.norm1 = N::kNorm1;
  s.norm2 = N::kNorm2;
  AttentionSpec& a = s.attention;
  a.n_head = m.n_head;
  a.n_kv_head = m.kv_heads();
  a.head_dim = m.head_size();
  a.q = N::kQ;
  a.k = N::kK;
  a.v = N::kV;
  a.o = N::kO;
  a.qkv_bias = m.attention_bias || m.qkv_bias;
  a.o_bias = m.attention_bias;
  a.rope_inv_freq = inv_freq;
  a.window = m.WindowOf(index);
  s.mlp = {MlpKind::kSwiGlu,
           m.mlp_hidden(),
           std::string(N::kGate),
           std::string(N::kUp),
           std::string(N::kDown),
           m.mlp_bias,
           0.02f};
  return std::make_unique<TransformerBlock>(s, std::move(provider));
}

LayerList Build(const ModelConfig& m, std::shared_ptr<const LinearProvider> provider) {
  LayerList layers;
  layers.push_back(
      std::make_unique<Embedding>(EmbeddingSpec{m.padded_vocab_size, m.n_embd, m.max_seq_len,
                                                std::string(LlamaNames::kTokens), ""},
                                  provider));
  const std::vector<float> inv_freq = RopeInverseFrequencies(m);
  for (int l = 0; l < m.n_layer; ++l) layers.push_back(Block(m, l, provider, inv_freq));
  HeadSpec head{m.vocab_size,
                m.padded_vocab_size,
                m.n_embd,
                {NormKind::kRmsNorm, static_cast<float>(m.norm_eps)},
                std::string(LlamaNames::kFinalNorm),
                std::string(LlamaNames::kHead),
                m.tie_word_embeddings ? std::string(LlamaNames::kTokens) : ""};
  layers.push_back(std::make_unique<LmHead>(head, std::move(provider)));
  return layers;
}

std::vector<std::string> ConfigProblems(const ModelConfig& m) {
  std::vector<std::string> p;
  if (m.kv_heads() < 1 || m.n_head % m.kv_heads() != 0) {
    p.push_back(detail::StrCat("model.n_kv_head ", m.kv_heads(), " must divide model.n_head ",
                               m.n_head, ": each key/value head serves n_head / n_kv_head "
                               "query heads"));
  }
  if (m.head_size() < 2 || m.head_size() % 2 != 0) {
    p.push_back(detail::StrCat("model.head_dim ", m.head_size(),
                               " must be even: RoPE turns pairs of features"));
  }
  if (m.rope_scaling.type != "none" && !(m.rope_scaling.factor > 0.0)) {
    p.push_back(detail::StrCat("model.rope_scaling.factor ", m.rope_scaling.factor,
                               " must be positive"));
  }
  if (m.rope_scaling.type == "llama3" &&
      !(m.rope_scaling.high_freq_factor > m.rope_scaling.low_freq_factor)) {
    p.push_back("model.rope_scaling.high_freq_factor must exceed low_freq_factor (llama3)");
  }
  if (!(m.rope_theta > 0.0)) p.push_back("model.rope_theta must be positive");
  if (m.sliding_window < 0) {
    p.push_back(detail::StrCat("model.sliding_window ", m.sliding_window,
                               " must be positive, or 0 for full attention"));
  }
  if (m.max_window_layers < 0 || (m.sliding_window == 0 && m.max_window_layers != 0)) {
    p.push_back(detail::StrCat("model.max_window_layers ", m.max_window_layers,
                               " needs model.sliding_window and must be 0 or more (layers "
                               "from it on use the window)"));
  }
  if (!(m.norm_eps > 0.0)) p.push_back("model.norm_eps must be positive");
  return p;
}

std::vector<std::string> TensorParallelProblems(const ModelConfig& m, int tp) {
  return {HeadSplitProblem("model.n_head", m.n_head, tp),
          HeadSplitProblem("model.n_kv_head", m.kv_heads(), tp),
          DivisibilityProblem("model.intermediate_size", m.mlp_hidden(), tp,
                              "use a tensor_parallel.size that divides it")};
}

}  // namespace

std::vector<float> RopeInverseFrequencies(const ModelConfig& m) {
  const int half = m.head_size() / 2;
  std::vector<float> f(static_cast<size_t>(half));
  const float theta = static_cast<float>(m.rope_theta), dim = static_cast<float>(m.head_size());
  for (int i = 0; i < half; ++i) {
    float x = 1.0f / std::pow(theta, static_cast<float>(2 * i) / dim);
    if (m.rope_scaling.type == "linear") x /= static_cast<float>(m.rope_scaling.factor);
    if (m.rope_scaling.type == "llama3") x = Llama3Frequency(x, m.rope_scaling);
    f[static_cast<size_t>(i)] = x;
  }
  return f;
}

ModelFamily LlamaFamily() {
  return {"llama",
          "Llama 2/3, Mistral, Qwen2 (Hugging Face LlamaForCausalLM and kin)",
          &Build,
          &ConfigProblems,
          &TensorParallelProblems,
          LlamaHfFamily(),
          {LlamaNames::kLoraTargets.begin(), LlamaNames::kLoraTargets.end()}};
}

}  // namespace ztrain::nn
