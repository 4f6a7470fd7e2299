// LoRA (Note [Adapters and frozen parameters], nn/adapters.h): every trainable tensor's
// gradient — adapters A and B (started non-zero: init_lora_weights false), the biases `bias`
// trains, the modules to save — against central finite differences of the loss, with the
// base frozen; the adapters in every place they attach (packed q/k/v windows, whole fused
// c_attn, row-parallel o/down/c_proj, layers_to_transform), rsLoRA scaling, over a quantized
// base (NF4 with double quantization, INT8: Note [Quantized base]). Besides: an
// adapted model with B = 0 computes the base model's loss bit for bit, frozen parameters have
// no gradient and no optimizer state, and the plan's refusals name the fix.
#include <gtest/gtest.h>

#include <cstring>

#include <string>

#include "engine/engine.h"
#include "finite_differences.h"
#include "nn/family.h"
#include "test_model.h"
#include "tests/expect_error.h"

namespace ztrain {
namespace {

struct Variant {
  std::string name;
  bool llama;
  nlohmann::json lora;
  nlohmann::json quantization = nullptr;  // a quantized base when set
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

nlohmann::json ConfigJson(const Variant& v) {
  nlohmann::json j = v.llama ? testing::TinyLlamaConfigJson() : testing::TinyConfigJson();
  j["lora"] = v.lora;
  if (!v.quantization.is_null()) j["quantization"] = v.quantization;
  return j;
}

Engine Make(const Config& cfg) {
  return Engine(
      cfg, nn::BuildModel(cfg.model, nn::MakeWholeLinears(), nn::AdapterPlan(cfg)));
}

class LoraGradientTest : public ::testing::TestWithParam<Variant> {};

TEST_P(LoraGradientTest, TrainableGradientsMatchFiniteDifferences) {
  const Config cfg = ParseConfig(ConfigJson(GetParam()));
  Engine engine = Make(cfg);
  ASSERT_LT(engine.NumTrainableParameters(), engine.NumParameters());
  int trainable = 0;
  for (const std::string& name : engine.ParameterNames()) trainable += engine.Trainable(name);
  testing::OwnedBatch batch(2, 7, 11, 9);
  const bool llama = GetParam().llama;
  // A step of 2e-3 (1e-2 leaves 5 % of curvature in a few products of perturbed adapters);
  // the loss's fp32 rounding, ~1e-7 over 4e-3, stays inside the absolute 3e-4.
  const int checked = testing::ExpectGradientsMatchFiniteDifferences(
      engine, batch, llama ? "embed_tokens.weight" : "wte", cfg.model.n_embd, 6, 2e-3f,
      /*training=*/cfg.lora.lora_dropout > 0.0);
  EXPECT_EQ(checked, trainable);
}

// The engine keeps gradients and Adam's m and v for the trainable parameters only (8 bytes
// each of m and v, padding aside), and no gradient for a frozen one.
TEST_P(LoraGradientTest, FrozenParametersHaveNoGradientOrOptimizerState) {
  const Config cfg = ParseConfig(ConfigJson(GetParam()));
  Engine engine = Make(cfg);
  const int64_t trainable = engine.NumTrainableParameters();
  const int64_t state = engine.memory().Current(MemoryCategory::kOptimizerState);
  // Padding: each parameter starts on a 16-element boundary, each layer pads to 16 x dp.
  const auto params = static_cast<int64_t>(engine.ParameterNames().size());
  EXPECT_GE(state, 8 * trainable);
  EXPECT_LT(state,
            8 * (trainable + 16 * params + 16 * static_cast<int64_t>(engine.layers().size())));
  EXPECT_EQ(engine.memory().Current(MemoryCategory::kGradients), state / 2);
  for (const std::string& name : engine.ParameterNames()) {
    if (engine.Trainable(name)) continue;
    EXPECT_THROW(engine.Gradient(name), Error) << name;
  }
}

const Variant kVariants[] = {
    {"llama_all_linear_bias_all",
     true,
     {{"r", 3},
      {"lora_alpha", 6},
      {"target_modules", "all-linear"},
      {"bias", "all"},
      {"init_lora_weights", false}}},
    {"llama_qv_window_rslora_layer1_head",
     true,
     {{"r", 2},
      {"lora_alpha", 5},
      {"use_rslora", true},
      {"target_modules", {"q_proj", "v_proj", "down_proj"}},
      {"layers_to_transform", 1},
      {"modules_to_save", {"lm_head"}},
      {"init_lora_weights", false}}},
    {"gpt2_fused_c_attn_lora_only",
     false,
     {{"r", 2},
      {"lora_alpha", 4},
      {"target_modules", {"c_attn", "c_proj", "c_fc"}},
      {"bias", "lora_only"},
      {"init_lora_weights", false}}},
    {"llama_nf4_double_quant_base",
     true,
     {{"r", 3}, {"lora_alpha", 6}, {"target_modules", "all-linear"}, {"init_lora_weights", false}},
     {{"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"}, {"bnb_4bit_use_double_quant", true}}},
    {"gpt2_int8_base",
     false,
     {{"r", 2}, {"lora_alpha", 4}, {"target_modules", {"c_attn", "c_fc"}}, {"bias", "all"},
      {"init_lora_weights", false}},
     {{"load_in_8bit", true}}},
    // Dropout (Note [LoRA dropout]): the differences of the training loss, which drops what
    // the gradient's forward dropped; packed q/k/v windows, row-parallel o/down.
    {"llama_dropout",
     true,
     {{"r", 2}, {"lora_alpha", 4}, {"target_modules", "all-linear"}, {"lora_dropout", 0.3},
      {"init_lora_weights", false}}},
    {"gpt2_dropout_nf4_base",
     false,
     {{"r", 2}, {"lora_alpha", 4}, {"target_modules", {"c_attn", "c_proj", "c_fc"}},
      {"lora_dropout", 0.5}, {"init_lora_weights", false}},
     {{"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"}}},
};

INSTANTIATE_TEST_SUITE_P(Variants, LoraGradientTest, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return info.param.name; });

// PEFT's default start (B = 0) is the base model: the same loss to the last bit as the
// model without adapters, on the same weights.
TEST(LoraTest, ZeroBIsTheBaseModel) {
  nlohmann::json j = testing::TinyLlamaConfigJson();
  const Config base = ParseConfig(j);
  j["lora"] = {{"r", 4}, {"target_modules", "all-linear"}};
  const Config adapted = ParseConfig(j);
  Engine plain(base, nn::BuildModel(base.model));
  Engine lora = Make(adapted);
  testing::OwnedBatch batch(2, 7, 11, 9);
  EXPECT_EQ(plain.EvalLoss(batch.mb), lora.EvalLoss(batch.mb));
  for (const std::string& name : lora.ParameterNames()) {
    if (name.find("lora_B") == std::string::npos) continue;
    const Tensor b = lora.Parameter(name);
    for (int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(b.data<float>()[i], 0.0f) << name;
  }
}

// LoRA dropout (Note [LoRA dropout]) changes training and nothing else: evaluation drops
// nothing (the loss of p = 0.5 equals p = 0's on the same weights), a step does (its loss
// differs), and a checkpointed block's recomputed forward draws the same mask as its first
// forward (the same losses and adapters to the last bit over steps whose masks differ).
TEST(LoraDropoutTest, TrainingDropsEvaluationDoesNotAndRecomputeDrawsTheSameMask) {
  nlohmann::json j = testing::TinyLlamaConfigJson();
  j["lora"] = {{"r", 2}, {"target_modules", "all-linear"}, {"init_lora_weights", false}};
  const Config none = ParseConfig(j);
  j["lora"]["lora_dropout"] = 0.5;
  const Config dropped = ParseConfig(j);
  j["activation_checkpointing"] = {{"enabled", true}};
  const Config recomputed = ParseConfig(j);
  Engine a = Make(none), b = Make(dropped), c = Make(recomputed);
  testing::OwnedBatch batch(2, 7, 11, 9);
  const std::span<const nn::MicroBatch> mbs(&batch.mb, 1);
  EXPECT_EQ(a.EvalLoss(batch.mb), b.EvalLoss(batch.mb));
  double previous = 0.0;
  for (int step = 0; step < 3; ++step) {
    const double lb = b.TrainStep(mbs).loss;
    EXPECT_EQ(c.TrainStep(mbs).loss, lb) << "step " << step;
    if (step == 0) {
      EXPECT_NE(a.TrainStep(mbs).loss, lb);
    }
    EXPECT_NE(lb, previous) << "step " << step;
    previous = lb;
  }
  for (const std::string& name : b.ParameterNames()) {
    if (!b.Trainable(name)) continue;
    const Tensor x = b.Parameter(name), y = c.Parameter(name);
    ASSERT_EQ(std::memcmp(x.data(), y.data(), x.nbytes()), 0) << name;
  }
}

TEST(LoraTest, PlanRefusalsNameTheFix) {
  auto build = [](nlohmann::json lora, bool tied = false) {
    nlohmann::json j = testing::TinyLlamaConfigJson();
    j["model"]["tie_word_embeddings"] = tied;
    j["lora"] = std::move(lora);
    const Config cfg = ParseConfig(j);
    nn::BuildModel(cfg.model, nn::MakeWholeLinears(), nn::AdapterPlan(cfg));
  };
  testing::ExpectErrorWith<ConfigError>(
      [&] {
        build({{"target_modules", {"qproj"}}});
      },
      {"qproj", "matched no linear", "q_proj"});
  testing::ExpectErrorWith<ConfigError>(
      [&] {
        build({{"target_modules", {"lm_head"}}});
      },
      {"lm_head", "modules_to_save"});
  testing::ExpectErrorWith<ConfigError>(
      [&] {
        build({{"modules_to_save", {"lm_head"}}}, /*tied=*/true);
      },
      {"lm_head", "tie_word_embeddings"});
  testing::ExpectErrorWith<ConfigError>(
      [&] {
        build({{"modules_to_save", {"nowhere"}}});
      },
      {"nowhere", "matched no module"});
  testing::ExpectErrorWith<ConfigError>(
      [&] {
        ParseConfig(nlohmann::json{{"lora", {{"r", 0}}}});
      },
      {"lora.r", "[1, 2^20]"});
  testing::ExpectErrorWith<ConfigError>(
      [&] {
        ParseConfig(nlohmann::json{{"lora", {{"init_lora_weights", "pissa"}}}});
      },
      {"lora.init_lora_weights", "pissa", "not run by ztrain"});
  testing::ExpectErrorWith<ConfigError>(
      [&] {
        ParseConfig(nlohmann::json{{"lora", {{"target_modules", "(["}}}});
      },
      {"lora.target_modules", "not a regular expression"});
  // A regular expression over Hugging Face module names, as PEFT matches a string.
  build({{"target_modules", "model\\.layers\\.1\\.self_attn\\.(q|v)_proj"}});
}

}  // namespace
}  // namespace ztrain
