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

// YaRN (transformers' _compute_yarn_parameters): dimensions that turn fewer than beta_slow times
// over the original context take the interpolated frequency (divided by `factor`), those that
// turn more than beta_fast times keep theirs, and a linear ramp blends the ones between.
std::vector<float> YarnFrequencies(const ModelConfig& m) {
  const RopeScalingConfig& s = m.rope_scaling;
  const int dim = m.head_size(), half = dim / 2;
  const double theta = m.rope_theta;
  const auto original = static_cast<double>(s.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {  // the dimension turning `rotations` times
    return dim * std::log(original / (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(theta));
  };
  const double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(s.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  const auto factor = static_cast<float>(s.factor);
  std::vector<float> f(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    const float pos_freq = std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / dim);
    const float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp(
        (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
        1.0f);
    const float keep = 1.0f - ramp;  // the share of the extrapolated frequency
    f[static_cast<size_t>(i)] = interpolation * (1.0f - keep) + extrapolation * keep;
  }
  return f;
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
  a.rope_scale = RopeAttentionFactor(m.rope_scaling);
  if (m.rope_scaling.type == "dynamic") {
    a.rope_for_length = [m](int64_t seq_len) { return RopeInverseFrequencies(m, seq_len); };
  }
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
  const std::string& rope = m.rope_scaling.type;
  if ((rope == "llama3" || rope == "yarn" || rope == "dynamic") &&
      m.rope_scaling.original_max_position_embeddings < 1) {
    p.push_back(detail::StrCat("model.rope_scaling.original_max_position_embeddings ",
                               m.rope_scaling.original_max_position_embeddings,
                               " must be positive (", rope, ")"));
  }
  if (rope == "yarn" &&
      !(m.rope_scaling.beta_fast > m.rope_scaling.beta_slow && m.rope_scaling.beta_slow > 0.0)) {
    p.push_back(detail::StrCat("model.rope_scaling.beta_fast ", m.rope_scaling.beta_fast,
                               " must exceed beta_slow ", m.rope_scaling.beta_slow,
                               ", and both be positive (yarn)"));
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

std::vector<float> RopeInverseFrequencies(const ModelConfig& m, int64_t seq_len) {
  const RopeScalingConfig& s = m.rope_scaling;
  if (s.type == "yarn") return YarnFrequencies(m);
  const int half = m.head_size() / 2;
  std::vector<float> f(static_cast<size_t>(half));
  double base = m.rope_theta;
  if (s.type == "dynamic" && seq_len > s.original_max_position_embeddings) {
    // transformers' _compute_dynamic_ntk_parameters, the sequence past the original context.
    const double d = m.head_size(), ratio = static_cast<double>(seq_len) /
                                            static_cast<double>(s.original_max_position_embeddings);
    base *= std::pow(s.factor * ratio - (s.factor - 1.0), d / (d - 2.0));
  }
  const float theta = static_cast<float>(base), dim = static_cast<float>(m.head_size());
  for (int i = 0; i < half; ++i) {
    float x = 1.0f / std::pow(theta, static_cast<float>(2 * i) / dim);
    if (m.rope_scaling.type == "linear") x /= static_cast<float>(m.rope_scaling.factor);
    if (m.rope_scaling.type == "llama3") x = Llama3Frequency(x, m.rope_scaling);
    f[static_cast<size_t>(i)] = x;
  }
  return f;
}

float RopeAttentionFactor(const RopeScalingConfig& s) {
  if (s.type != "yarn") return 1.0f;
  if (s.attention_factor > 0.0) return static_cast<float>(s.attention_factor);
  auto mscale = [&](double m) {
    return s.factor <= 1.0 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0;
  };
  if (s.mscale != 0.0 && s.mscale_all_dim != 0.0) {
    return static_cast<float>(mscale(s.mscale) / mscale(s.mscale_all_dim));
  }
  return static_cast<float>(mscale(1.0));
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
