// nn/decoder.h: the KV-cache decoder against the training forward (the engine's loss on the
// same weights), incremental steps against one step over the whole sequence, for GPT-2 and a
// Llama with grouped-query attention and RoPE; sampling's rules. The greedy tokens against a
// PyTorch reference that reruns the full forward are checked at the command line
// (tests/launcher/generate_cli_test.sh).
#include "nn/decoder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "engine/engine.h"
#include "tests/engine/test_model.h"

namespace ztrain {
namespace {

// Deterministic weights: norm weights near 1, the rest spread like an initialised model's.
void Fill(const std::string& name, const Tensor& out) {
  const bool norm = name.find("ln") != std::string::npos || name.find("norm") != std::string::npos;
  uint64_t h = std::hash<std::string>{}(name);
  float* p = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    const float u = static_cast<float>(h >> 40) / static_cast<float>(1 << 24) - 0.5f;
    p[i] = norm ? 1.0f + 0.2f * u : 0.6f * u;
  }
}

// "Gpt2", "Llama", "LlamaYarn" (YaRN RoPE), or a Llama with sliding windows shorter than the
// test sequence (20 tokens):
// "LlamaWindow" slides layer 1 only (window 4; layer 0 attends fully), "LlamaWindowAll" every
// layer (window 3), so that the cache of a sliding layer wraps around (Note [Windowed KV
// cache]).
Config TestConfig(const std::string& family) {
  const bool llama = family != "Gpt2";
  nlohmann::json j = llama ? testing::TinyLlamaConfigJson(2, 11, 32)
                           : testing::TinyConfigJson(2, 8, 2, 11, 32);
  if (family == "LlamaWindow") {
    j["model"]["sliding_window"] = 4;
    j["model"]["max_window_layers"] = 1;
  }
  if (family == "LlamaWindowAll") j["model"]["sliding_window"] = 3;
  if (family == "LlamaYarn") {  // frequencies and the factor on cos and sin fixed per model
    j["model"]["rope_scaling"] = {
        {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 8}};
  }
  j["train_micro_batch_size_per_gpu"] = 1;
  j.erase("train_batch_size");
  j["device"] = "cpu";
  return ParseConfig(j);
}

const std::vector<int32_t> kSequence = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4};

double MaxRelativeDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 1e-3;
  for (float x : a) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / scale);
  return worst;
}

class DecoderTest : public ::testing::TestWithParam<std::string> {};

// Each step's logits equal one step over the whole prefix (the cache holds what recomputing
// would give), for a prompt fed at once and every later token fed alone.
TEST_P(DecoderTest, IncrementalStepsEqualOneStepOverThePrefix) {
  const Config c = TestConfig(GetParam());
  nn::Decoder incremental(c.model, Fill);
  nn::Decoder whole(c.model, Fill);
  std::vector<float> logits = incremental.Step(std::span(kSequence).first(5));
  for (size_t k = 5; k <= kSequence.size(); ++k) {
    whole.Reset();
    const std::vector<float> reference = whole.Step(std::span(kSequence).first(k));
    ASSERT_EQ(logits.size(), 11u);
    EXPECT_LT(MaxRelativeDiff(logits, reference), 1e-5) << "prefix " << k;
    if (k < kSequence.size()) logits = incremental.Step(std::span(kSequence).subspan(k, 1));
  }
  EXPECT_EQ(incremental.length(), 20);
}

// The decoder's logits give the training forward's loss: the engine's mean cross-entropy of
// the sequence's next tokens on the same weights.
TEST_P(DecoderTest, LogitsGiveTheTrainingForwardsLoss) {
  const Config c = TestConfig(GetParam());
  Engine engine(c, nn::BuildModel(c.model));
  engine.SetFullParameters(Fill);
  const int64_t t = 19;
  std::vector<int32_t> tokens(kSequence.begin(), kSequence.begin() + t);
  std::vector<int32_t> targets(kSequence.begin() + 1, kSequence.end());
  nn::MicroBatch mb;
  mb.tokens = Tensor(tokens.data(), DType::kI32, {1, t});
  mb.targets = Tensor(targets.data(), DType::kI32, {1, t});
  const double engine_loss = engine.EvalLoss(mb);
  nn::Decoder decoder(c.model, Fill);
  double loss = 0;
  for (int64_t i = 0; i < t; ++i) {
    const std::vector<float> logits = decoder.Step(std::span(kSequence).subspan(i, 1));
    double max = logits[0], sum = 0;
    for (float x : logits) max = std::max(max, static_cast<double>(x));
    for (float x : logits) sum += std::exp(x - max);
    loss += std::log(sum) + max - logits[targets[i]];
  }
  EXPECT_NEAR(loss / t, engine_loss, 1e-5 * std::fabs(engine_loss));
}

// A sliding layer's cache holds the window, a full layer's the whole context: 2 layers of K and
// V caches, rows of n_kv_head * head_dim = 8 fp32 values, model.max_seq_len 32.
TEST_P(DecoderTest, SlidingLayersCacheOnlyTheWindow) {
  if (GetParam() == "Gpt2") GTEST_SKIP() << "GPT-2 has no window";
  const Config c = TestConfig(GetParam());
  nn::Decoder decoder(c.model, Fill);
  decoder.Step(kSequence);
  const int64_t row = 8 * 4, full = 2 * 32 * row;  // one layer's K and V
  const std::map<std::string, int64_t> want = {{"Llama", 2 * full},
                                               {"LlamaWindow", full + 2 * 4 * row},
                                               {"LlamaWindowAll", 2 * (2 * 3 * row)},
                                               {"LlamaYarn", 2 * full}};
  EXPECT_EQ(decoder.cache_bytes(), want.at(GetParam()));
}

TEST_P(DecoderTest, RefusesToPassMaxSeqLen) {
  const Config c = TestConfig(GetParam());
  nn::Decoder decoder(c.model, Fill);
  const std::vector<int32_t> long_prompt(33, 1);
  try {
    decoder.Step(long_prompt);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("more than model.max_seq_len 32"), std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DecoderTest,
                         ::testing::Values("Gpt2", "Llama", "LlamaWindow", "LlamaWindowAll",
                                           "LlamaYarn"),
                         [](const auto& info) { return info.param; });

TEST(SamplingTest, GreedyTopKOneAndATinyTopPPickTheLargest) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  nn::SamplingOptions o;
  EXPECT_EQ(nn::SampleToken(logits, o, 0.99), 1);  // greedy: the first of the largest
  o.temperature = 5;
  o.top_k = 1;
  EXPECT_EQ(nn::SampleToken(logits, o, 0.99), 1);
  o.top_k = 0;
  o.top_p = 1e-6;
  EXPECT_EQ(nn::SampleToken(logits, o, 0.99), 1);
}

// Over a fine grid of draws, each token is picked for its softmax probability's share of the
// grid; top-k and top-p renormalise over what they keep.
TEST(SamplingTest, DrawsFollowTheTemperedSoftmax) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, -0.5f};
  const auto shares = [&](const nn::SamplingOptions& o) {
    std::vector<double> count(logits.size(), 0);
    const int grid = 100000;
    for (int i = 0; i < grid; ++i) ++count[nn::SampleToken(logits, o, (i + 0.5) / grid)];
    for (double& c : count) c /= grid;
    return count;
  };
  nn::SamplingOptions o;
  o.temperature = 0.7;
  double z = 0;
  for (float x : logits) z += std::exp(x / 0.7);
  std::vector<double> s = shares(o);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(s[i], std::exp(logits[i] / 0.7) / z, 1e-4);
  o.top_k = 2;  // tokens 2 and 1 only
  s = shares(o);
  const double z2 = std::exp(2 / 0.7) + std::exp(1 / 0.7);
  EXPECT_NEAR(s[2], std::exp(2 / 0.7) / z2, 1e-4);
  EXPECT_NEAR(s[1], std::exp(1 / 0.7) / z2, 1e-4);
  EXPECT_EQ(s[0] + s[3], 0.0);
  o.top_k = 0;
  o.top_p = 0.8;  // token 2 holds 0.754 of the mass, with token 1 0.935: both are kept
  s = shares(o);
  EXPECT_NEAR(s[2], std::exp(2 / 0.7) / z2, 1e-4);
  EXPECT_EQ(s[0] + s[3], 0.0);
}

TEST(SamplingTest, ASeedGivesTheSameSampleTwice) {
  const Config c = TestConfig("Llama");
  nn::Decoder decoder(c.model, Fill);
  nn::SamplingOptions o;
  o.max_new_tokens = 12;
  o.temperature = 1.0;
  o.seed = 42;
  const std::vector<int32_t> prompt = {3, 1, 4};
  const std::vector<int32_t> a = nn::Generate(decoder, prompt, o);
  const std::vector<int32_t> b = nn::Generate(decoder, prompt, o);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 12u);
  o.stop_tokens = {a[3]};
  EXPECT_EQ(nn::Generate(decoder, prompt, o).size(), static_cast<size_t>(
      std::find(a.begin(), a.end(), a[3]) - a.begin() + 1));
}

// A model with more ids than its tokenizer: Generate picks none of the extra ones, while
// without the limit a sample of this untrained model does.
TEST(SamplingTest, VocabLimitKeepsToTheTokenizersIds) {
  const Config c = TestConfig("Llama");
  nn::Decoder decoder(c.model, Fill);
  nn::SamplingOptions o;
  o.max_new_tokens = 28;
  o.temperature = 1.0;
  o.seed = 7;
  const std::vector<int32_t> prompt = {3, 1, 4};
  const int64_t limit = c.model.vocab_size / 2;
  const auto above = [&](const std::vector<int32_t>& t) {
    return std::count_if(t.begin(), t.end(), [&](int32_t id) { return id >= limit; });
  };
  ASSERT_GT(above(nn::Generate(decoder, prompt, o)), 0);
  o.vocab_limit = limit;
  const std::vector<int32_t> limited = nn::Generate(decoder, prompt, o);
  EXPECT_EQ(limited.size(), 28u);
  EXPECT_EQ(above(limited), 0);
}

}  // namespace
}  // namespace ztrain
