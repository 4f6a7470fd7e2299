// GPT-2's Hugging Face adapter (GPT2LMHeadModel): config.json keys, and tensor names with the
// "transformer." prefix, Conv1D weights [in, out] (ztrain and llm.c store [out, in]), wte
// without the padding rows, and no lm_head.weight (tied to wte).
#include <memory>
#include <string_view>

#include "nn/gpt2.h"

namespace ztrain::nn {
namespace {

using nlohmann::json;

json ReadConfig(const json& hf, const std::string& path, json* /*notes*/) {
  const auto refuse = [&](bool bad, const std::string& what) {
    ZTRAIN_CHECK_T(ConfigError, !bad, path, ": ", what,
                   "; ztrain's GPT-2 is llm.c's (tanh GELU, LayerNorm eps 1e-5, MLP 4 n_embd "
                   "wide, tied embeddings)");
  };
  const int64_t n_embd = HfInt(hf, "n_embd", path);
  const std::string act = HfString(hf, "activation_function", path, "gelu_new");
  refuse(act != "gelu_new" && act != "gelu_pytorch_tanh",
         "activation_function '" + act + "' is not the tanh GELU (gelu_new)");
  const double eps = HfNumber(hf, "layer_norm_epsilon", path, 1e-5);
  refuse(eps != 1e-5, ztrain::detail::StrCat("layer_norm_epsilon ", eps, " is not 1e-5"));
  const int64_t inner = HfInt(hf, "n_inner", path, 4 * n_embd);
  refuse(inner != 4 * n_embd, ztrain::detail::StrCat("n_inner ", inner, " is not 4 n_embd"));
  refuse(!HfBool(hf, "tie_word_embeddings", path, true), "tie_word_embeddings is false");
  refuse(!HfBool(hf, "scale_attn_weights", path, true), "scale_attn_weights is false");
  refuse(HfBool(hf, "scale_attn_by_inverse_layer_idx", path, false),
         "scale_attn_by_inverse_layer_idx is true");
  return {{"type", "gpt2"},
          {"n_layer", HfInt(hf, "n_layer", path)},
          {"n_head", HfInt(hf, "n_head", path)},
          {"n_embd", n_embd},
          {"vocab_size", HfInt(hf, "vocab_size", path)},
          {"max_seq_len", HfInt(hf, "n_positions", path, HfInt(hf, "n_ctx", path, 1024))}};
}

json WriteConfig(const ModelConfig& m, DType dtype) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"activation_function", "gelu_new"},
          {"n_ctx", m.max_seq_len},
          {"n_positions", m.max_seq_len},
          {"n_embd", m.n_embd},
          {"n_head", m.n_head},
          {"n_layer", m.n_layer},
          {"n_inner", nullptr},
          {"vocab_size", m.vocab_size},
          {"layer_norm_epsilon", 1e-5},
          {"initializer_range", 0.02},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"scale_attn_weights", true},
          {"tie_word_embeddings", true},
          {"use_cache", true},
          {"torch_dtype", HfTorchDType(dtype)}};
}

}  // namespace

// The builder's parameters, in model order (HF's state_dict order), named and shaped by the
// name table (Note [Family name tables]).
std::vector<HfTensor> HfGpt2Layout(const ModelConfig& m) {
  using N = Gpt2Names;
  auto conv1d = [](std::string_view name) {  // a Conv1D module's weight
    constexpr std::string_view kWeight = ".weight";
    if (!name.ends_with(kWeight)) return false;
    name.remove_suffix(kWeight.size());
    for (std::string_view module : N::kConv1d) {
      if (name.ends_with(module)) return true;
    }
    return false;
  };
  std::vector<HfTensor> out;
  for (const std::unique_ptr<Layer>& layer : BuildGpt2(m)) {
    for (const ParamSpec& p : layer->Params()) {
      if (!p.tied_to.empty()) continue;
      std::string hf_name = std::string(N::kHfPrefix) + p.name;
      Shape hf_shape = p.shape;
      const bool embedding = p.name == N::kTokens || p.name == N::kPositions;
      if (embedding) hf_name += N::kHfEmbeddingSuffix;
      if (p.name == N::kTokens) hf_shape[0] = m.vocab_size;  // without the padding rows
      const bool transposed = conv1d(p.name);
      if (transposed) hf_shape = {p.shape[1], p.shape[0]};
      out.push_back({hf_name, hf_shape, p.name, p.shape, transposed});
    }
  }
  return out;
}

HfFamily Gpt2HfFamily() {
  // attn.bias / attn.masked_bias: the causal-mask buffers older GPT-2 files carry;
  // lm_head.weight: a tied copy of wte some writers add.
  return {{"GPT2LMHeadModel"},
          {"gpt2"},
          &ReadConfig,
          &WriteConfig,
          &HfGpt2Layout,
          {".attn.bias", ".attn.masked_bias", std::string(Gpt2Names::kHead)},
          {{"n_layer", "n_layer"},
           {"n_head", "n_head"},
           {"n_embd", "n_embd"},
           {"vocab_size", "vocab_size"},
           {"max_seq_len", "n_positions"}}};
}

}  // namespace ztrain::nn
