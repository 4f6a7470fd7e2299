// The whole Llama-family model's gradients (every parameter tensor) against central finite
// differences of the loss, in the variants the family's config gives: grouped-query and
// multi-query attention, head_dim not n_embd / n_head, q/k/v/o biases (Llama's
// attention_bias), q/k/v biases only (Qwen2), MLP biases, a tied or untied head, llama3 and
// linear RoPE scaling. A wrong sign, a missing term or a gradient that skips a path (RoPE's
// inverse rotation, a KV head's sum over its query heads) moves a gradient by O(1).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "engine/engine.h"
#include "nn/family.h"
#include "finite_differences.h"
#include "test_model.h"

namespace ztrain {
namespace {

struct Variant {
  std::string name;
  nlohmann::json model;  // merged into TinyLlamaConfigJson's model section
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class LlamaGradientTest : public ::testing::TestWithParam<Variant> {};

TEST_P(LlamaGradientTest, MatchesFiniteDifferences) {
  nlohmann::json j = testing::TinyLlamaConfigJson();
  j["model"].update(GetParam().model);
  const Config cfg = ParseConfig(j);
  Engine engine(cfg, nn::BuildModel(cfg.model));
  testing::OwnedBatch batch(2, 7, 11, 9);
  const int checked = testing::ExpectGradientsMatchFiniteDifferences(
      engine, batch, "embed_tokens.weight", cfg.model.n_embd);
  EXPECT_EQ(checked, static_cast<int>(engine.ParameterNames().size()));
}

// Parameters per block: 2 norms, q, k, v, o, gate, up, down, plus the biases a variant adds.
TEST_P(LlamaGradientTest, DeclaresHuggingFaceShapedParameters) {
  nlohmann::json j = testing::TinyLlamaConfigJson();
  j["model"].update(GetParam().model);
  const Config cfg = ParseConfig(j);
  const nn::LayerList layers = nn::BuildModel(cfg.model);
  const ModelConfig& m = cfg.model;
  const int64_t q = int64_t{m.n_head} * m.head_size(), kv = int64_t{m.kv_heads()} * m.head_size();
  std::map<std::string, Shape> shapes;
  for (const auto& layer : layers) {
    for (const nn::ParamSpec& s : layer->Params()) shapes[s.name] = s.shape;
  }
  EXPECT_EQ(shapes.at("embed_tokens.weight"), (Shape{16, m.n_embd}));
  EXPECT_EQ(shapes.at("layers.1.self_attn.q_proj.weight"), (Shape{q, m.n_embd}));
  EXPECT_EQ(shapes.at("layers.1.self_attn.k_proj.weight"), (Shape{kv, m.n_embd}));
  EXPECT_EQ(shapes.at("layers.1.self_attn.v_proj.weight"), (Shape{kv, m.n_embd}));
  EXPECT_EQ(shapes.at("layers.1.self_attn.o_proj.weight"), (Shape{m.n_embd, q}));
  EXPECT_EQ(shapes.at("layers.1.mlp.gate_proj.weight"), (Shape{m.mlp_hidden(), m.n_embd}));
  EXPECT_EQ(shapes.at("layers.1.mlp.down_proj.weight"), (Shape{m.n_embd, m.mlp_hidden()}));
  EXPECT_EQ(shapes.at("layers.0.input_layernorm.weight"), (Shape{m.n_embd}));
  EXPECT_EQ(shapes.at("norm.weight"), (Shape{m.n_embd}));
  EXPECT_EQ(shapes.count("layers.0.input_layernorm.bias"), 0u);  // RMSNorm: no bias
  EXPECT_EQ(shapes.count("layers.0.self_attn.q_proj.bias"), m.attention_bias || m.qkv_bias);
  EXPECT_EQ(shapes.count("layers.0.self_attn.o_proj.bias"), m.attention_bias ? 1u : 0u);
  EXPECT_EQ(shapes.count("layers.0.mlp.up_proj.bias"), m.mlp_bias ? 1u : 0u);
  EXPECT_EQ(shapes.count("wpe"), 0u);
  EXPECT_EQ(shapes.count("lm_head.weight"), 1u);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, LlamaGradientTest,
    ::testing::Values(
        Variant{"gqa_untied", nlohmann::json::object()},
        Variant{"mqa_tied_qkv_bias", {{"n_kv_head", 1}, {"tie_word_embeddings", true},
                                      {"qkv_bias", true}}},
        Variant{"mha_all_biases_llama3",
                {{"n_kv_head", 4},
                 {"attention_bias", true},
                 {"mlp_bias", true},
                 {"rope_scaling",
                  {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                   {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 16}}}}},
        Variant{"linear_rope_head_dim_6",
                {{"head_dim", 6}, {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}}}),
    [](const ::testing::TestParamInfo<Variant>& info) { return info.param.name; });

}  // namespace
}  // namespace ztrain
