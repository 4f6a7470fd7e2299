// The Llama family's Hugging Face adapter: LlamaForCausalLM, MistralForCausalLM and
// Qwen2ForCausalLM config.json files, and tensor names that are ztrain's with HF's "model."
// prefix (the head's "lm_head.weight" has none), embedding and head rows without the
// vocabulary padding.
#include <algorithm>

#include "nn/llama.h"
#include "nn/transformer.h"

namespace ztrain::nn {
namespace {

using ztrain::detail::StrCat;
using nlohmann::json;

// "llama", "mistral" or "qwen2": the HF class a config.json describes.
std::string Variant(const json& hf) {
  const std::string type = hf.value("model_type", std::string());
  if (type == "mistral" || type == "qwen2") return type;
  if (hf.contains("architectures") && hf["architectures"].is_array()) {
    for (const json& a : hf["architectures"]) {
      if (a == "MistralForCausalLM") return "mistral";
      if (a == "Qwen2ForCausalLM") return "qwen2";
    }
  }
  return "llama";
}

// rope_scaling as ztrain's model.rope_scaling, and the context the model runs at: transformers
// lets YaRN and dynamic NTK models run past max_position_embeddings (the point of scaling), so
// ztrain's max_seq_len becomes factor x the original context when that is longer. Dynamic's
// original context is HF's max_position_embeddings; YaRN's its own key, else that.
json RopeScaling(const json& hf, const std::string& path, int64_t* max_seq_len) {
  json none = {{"rope_type", "none"}};
  if (!hf.contains("rope_scaling") || hf["rope_scaling"].is_null()) return none;
  const json& rs = hf["rope_scaling"];
  ZTRAIN_CHECK_T(ConfigError, rs.is_object(), path, ": rope_scaling must be an object or null");
  // transformers accepts the older "type" for "rope_type".
  const std::string type = HfString(rs, "rope_type", path, HfString(rs, "type", path, "default"));
  if (type == "default") return none;
  ZTRAIN_CHECK_T(ConfigError,
                 type == "linear" || type == "llama3" || type == "yarn" || type == "dynamic", path,
                 ": rope_scaling type '", type,
                 "' is not one ztrain runs; it runs \"linear\", \"llama3\", \"yarn\" and "
                 "\"dynamic\" (and none)");
  const int64_t max_pos = *max_seq_len;
  const bool has_factor = rs.contains("factor") && !rs["factor"].is_null();
  json out = {{"rope_type", type}, {"factor", HfNumber(rs, "factor", path, 1.0)}};
  if (type == "llama3") {
    out["low_freq_factor"] = HfNumber(rs, "low_freq_factor", path, 1.0);
    out["high_freq_factor"] = HfNumber(rs, "high_freq_factor", path, 4.0);
    out["original_max_position_embeddings"] =
        HfInt(rs, "original_max_position_embeddings", path, 8192);
  }
  if (type == "yarn") {
    const int64_t original = HfInt(rs, "original_max_position_embeddings", path, max_pos);
    // DeepSeek-V3 leaves factor out: the ratio of the two contexts (transformers' rule).
    if (!has_factor) out["factor"] = static_cast<double>(max_pos) / static_cast<double>(original);
    out["original_max_position_embeddings"] = original;
    auto optional = [&](const char* key) {
      if (rs.contains(key) && !rs[key].is_null()) out[key] = HfNumber(rs, key, path, 0.0);
    };
    optional("beta_fast");
    optional("beta_slow");
    optional("mscale");
    optional("mscale_all_dim");
    optional("attention_factor");
  }
  if (type == "dynamic") out["original_max_position_embeddings"] = max_pos;
  if (type == "yarn" || type == "dynamic") {
    const double longer =
        out["factor"].get<double>() *
        static_cast<double>(out["original_max_position_embeddings"].get<int64_t>());
    *max_seq_len = std::max(max_pos, static_cast<int64_t>(std::llround(longer)));
  }
  return out;
}

// {sliding_window, max_window_layers} as transformers decides which layers slide: Mistral's
// sliding_window (null: none) in every layer; Qwen2's only with use_sliding_window, in layers
// from max_window_layers on (Qwen2Config's layer_types, which a config.json may also spell
// out: then it must be full layers followed by sliding ones).
std::pair<int64_t, int64_t> SlidingWindow(const json& hf, const std::string& variant,
                                          const std::string& path, int64_t n_layer) {
  const bool has_window = hf.contains("sliding_window") && !hf["sliding_window"].is_null();
  if (variant == "mistral") return {has_window ? HfInt(hf, "sliding_window", path) : 0, 0};
  if (variant != "qwen2" || !HfBool(hf, "use_sliding_window", path, false)) return {0, 0};
  ZTRAIN_CHECK_T(ConfigError, has_window, path,
                 ": use_sliding_window is true but sliding_window is null");
  int64_t full = HfInt(hf, "max_window_layers", path, 28);
  if (hf.contains("layer_types") && hf["layer_types"].is_array()) {
    const json& types = hf["layer_types"];
    full = 0;
    while (full < static_cast<int64_t>(types.size()) && types[full] == "full_attention") ++full;
    for (int64_t l = full; l < static_cast<int64_t>(types.size()); ++l) {
      ZTRAIN_CHECK_T(ConfigError, types[l] == "sliding_attention", path, ": layer_types[", l,
                     "] is ", types[l].dump(),
                     " after a sliding layer; ztrain runs full layers "
                     "followed by sliding ones (Qwen2's max_window_layers)");
    }
  }
  if (full >= n_layer) return {0, 0};  // no layer slides
  return {HfInt(hf, "sliding_window", path), full};
}

json ReadConfig(const json& hf, const std::string& path, json* notes) {
  const std::string variant = Variant(hf);
  const std::string act = HfString(hf, "hidden_act", path, "silu");
  ZTRAIN_CHECK_T(ConfigError, act == "silu", path, ": hidden_act '", act,
                 "' is not SwiGLU's silu, the only MLP activation the llama family runs");
  const int64_t n_embd = HfInt(hf, "hidden_size", path);
  const int64_t n_head = HfInt(hf, "num_attention_heads", path);
  int64_t max_seq_len = HfInt(hf, "max_position_embeddings", path);
  const json rope_scaling = RopeScaling(hf, path, &max_seq_len);
  json m = {{"type", "llama"},
            {"n_layer", HfInt(hf, "num_hidden_layers", path)},
            {"n_head", n_head},
            {"n_embd", n_embd},
            {"n_kv_head", HfInt(hf, "num_key_value_heads", path, n_head)},
            {"head_dim", HfInt(hf, "head_dim", path, n_head > 0 ? n_embd / n_head : 0)},
            {"intermediate_size", HfInt(hf, "intermediate_size", path)},
            {"vocab_size", HfInt(hf, "vocab_size", path)},
            {"max_seq_len", max_seq_len},
            {"norm_eps", HfNumber(hf, "rms_norm_eps", path, 1e-6)},
            {"rope_theta", HfNumber(hf, "rope_theta", path, 10000.0)},
            {"rope_scaling", rope_scaling},
            {"tie_word_embeddings", HfBool(hf, "tie_word_embeddings", path, false)},
            {"attention_bias", variant == "llama" && HfBool(hf, "attention_bias", path, false)},
            {"qkv_bias", variant == "qwen2"},
            {"mlp_bias", variant == "llama" && HfBool(hf, "mlp_bias", path, false)}};
  const auto [window, full_layers] = SlidingWindow(hf, variant, path, m["n_layer"].get<int64_t>());
  m["sliding_window"] = window;
  m["max_window_layers"] = full_layers;
  if (window > 0) {  // the log reads "sliding_window from <this>"
    (*notes)["sliding_window"] =
        variant == "mistral" ? std::string("Mistral's sliding_window, in every layer")
                             : StrCat("Qwen2's use_sliding_window, in layers ", full_layers, " on");
  }
  return m;
}

json WriteConfig(const ModelConfig& m, DType dtype) {
  const bool qwen2 = m.qkv_bias && !m.attention_bias && !m.mlp_bias;
  json rope = nullptr;
  if (m.rope_scaling.type != "none") {
    rope = {{"rope_type", m.rope_scaling.type}, {"factor", m.rope_scaling.factor}};
    const RopeScalingConfig& s = m.rope_scaling;
    if (s.type == "llama3" || s.type == "yarn") {
      rope["original_max_position_embeddings"] = s.original_max_position_embeddings;
    }
    if (s.type == "llama3") {
      rope["low_freq_factor"] = s.low_freq_factor;
      rope["high_freq_factor"] = s.high_freq_factor;
    }
    if (s.type == "yarn") {
      rope["beta_fast"] = s.beta_fast;
      rope["beta_slow"] = s.beta_slow;
      if (s.mscale != 0.0) rope["mscale"] = s.mscale;
      if (s.mscale_all_dim != 0.0) rope["mscale_all_dim"] = s.mscale_all_dim;
      if (s.attention_factor > 0.0) rope["attention_factor"] = s.attention_factor;
    }
  }
  // Dynamic NTK reads its original context from max_position_embeddings (RopeScaling above).
  const int64_t max_positions = m.rope_scaling.type == "dynamic"
                                    ? m.rope_scaling.original_max_position_embeddings
                                    : m.max_seq_len;
  json c = {{"architectures", {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
            {"model_type", qwen2 ? "qwen2" : "llama"},
            {"hidden_act", "silu"},
            {"hidden_size", m.n_embd},
            {"intermediate_size", m.mlp_hidden()},
            {"num_hidden_layers", m.n_layer},
            {"num_attention_heads", m.n_head},
            {"num_key_value_heads", m.kv_heads()},
            {"head_dim", m.head_size()},
            {"vocab_size", m.vocab_size},
            {"max_position_embeddings", max_positions},
            {"rms_norm_eps", m.norm_eps},
            {"rope_theta", m.rope_theta},
            {"rope_scaling", rope},
            {"tie_word_embeddings", m.tie_word_embeddings},
            {"initializer_range", 0.02},
            {"attention_dropout", 0.0},
            {"use_cache", true},
            {"torch_dtype", HfTorchDType(dtype)}};
  const bool windowed = m.sliding_window > 0;
  if (qwen2) {
    c["use_sliding_window"] = windowed;
    c["sliding_window"] = windowed ? json(m.sliding_window) : json(nullptr);
    c["max_window_layers"] = windowed ? m.max_window_layers : m.n_layer;
  } else if (windowed) {  // every layer slides: Mistral
    ZTRAIN_CHECK_T(ConfigError, m.max_window_layers == 0 && !m.attention_bias && !m.mlp_bias,
                   "a Llama-family model with a sliding window ",
                   m.max_window_layers > 0 ? "from layer " + std::to_string(m.max_window_layers)
                                           : std::string("and biases"),
                   " is neither a Mistral nor a Qwen2 Hugging Face model; no HF class reads it");
    c["architectures"] = {"MistralForCausalLM"};
    c["model_type"] = "mistral";
    c["sliding_window"] = m.sliding_window;
  } else {
    ZTRAIN_CHECK_T(ConfigError, !m.qkv_bias || m.attention_bias, "model.qkv_bias with ",
                   "model.mlp_bias is neither a Llama nor a Qwen2 Hugging Face model; no HF "
                   "class reads it");
    c["attention_bias"] = m.attention_bias;
    c["mlp_bias"] = m.mlp_bias;
  }
  return c;
}

// The model's own parameters, in model order (which is HF's state_dict order), each named
// as HF names it.
std::vector<HfTensor> Layout(const ModelConfig& m) {
  std::vector<HfTensor> out;
  for (const std::unique_ptr<Layer>& layer : BuildModel(m)) {
    for (const ParamSpec& p : layer->Params()) {
      if (!p.tied_to.empty()) continue;
      const bool head = p.name == LlamaNames::kHead;
      Shape hf_shape = p.shape;
      if (head || p.name == LlamaNames::kTokens) hf_shape[0] = m.vocab_size;
      out.push_back({head ? p.name : std::string(LlamaNames::kHfPrefix) + p.name, hf_shape, p.name,
                     p.shape, false});
    }
  }
  return out;
}

}  // namespace

HfFamily LlamaHfFamily() {
  return {{"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"},
          {"llama", "mistral", "qwen2"},
          &ReadConfig,
          &WriteConfig,
          &Layout,
          {".rotary_emb.inv_freq"},
          {{"n_layer", "num_hidden_layers"},
           {"n_head", "num_attention_heads"},
           {"n_embd", "hidden_size"},
           {"n_kv_head", "num_key_value_heads"},
           {"head_dim", "head_dim"},
           {"intermediate_size", "intermediate_size"},
           {"vocab_size", "vocab_size"},
           {"max_seq_len", "max_position_embeddings"},
           {"norm_eps", "rms_norm_eps"},
           {"rope_theta", "rope_theta"}}};
}

}  // namespace ztrain::nn
