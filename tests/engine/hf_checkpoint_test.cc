// Hugging Face model directories (nn/hf_checkpoint.h) and the families' adapters: what the
// writer puts in a directory reads back element for element through the reader at any range
// (sharded with an index, F32 / BF16 / F16, GPT-2's transposed Conv1D weights, padding rows);
// config.json reads into ztrain's model keys and back; every malformed directory is an error
// naming the file, the tensor and the fix; a config key that disagrees with the directory
// names both values.
#include "nn/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../expect_error.h"
#include "core/dtype.h"
#include "engine/engine.h"
#include "nn/family.h"
#include "run/model_weights.h"
#include "run/preflight.h"
#include "run/run_config.h"
#include "test_model.h"
#include "tests/data/data_test_util.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ExpectErrorWith;

using data::test_util::TempDir;

ModelConfig TinyLlama(bool tied) {
  json j = testing::TinyLlamaConfigJson();
  j["model"]["tie_word_embeddings"] = tied;
  j["model"]["attention_bias"] = true;
  return ParseConfig(j).model;
}

ModelConfig TinyGpt2() { return ParseConfig(testing::TinyConfigJson()).model; }

// Random whole values for every parameter of the family's layout.
std::map<std::string, std::vector<float>> RandomParameters(const ModelConfig& m) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::map<std::string, std::vector<float>> values;
  for (const nn::HfTensor& t : nn::FindModelFamily(m.type).hf.layout(m)) {
    std::vector<float>& v = values[t.param];
    v.resize(static_cast<size_t>(NumElements(t.param_shape)));
    for (float& x : v) x = d(rng);
    // The padding rows are not in the file: zero, as a loaded model has them.
    for (int64_t i = NumElements(t.hf_shape); !t.transposed && i < NumElements(t.param_shape); ++i)
      v[static_cast<size_t>(i)] = 0.0f;
  }
  return values;
}

int Write(const fs::path& dir, const ModelConfig& m,
          const std::map<std::string, std::vector<float>>& values, DType dtype, int64_t max_shard) {
  nn::HfModelWriter w(dir.string(), m, dtype, max_shard);
  // In reverse order: a shard is written when its last tensor arrives, whatever the order.
  for (auto it = values.rbegin(); it != values.rend(); ++it) w.Add(it->first, it->second.data());
  return w.Finish();
}

std::string ShardFile(int k, int n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k, n);
  return name;
}

std::string ConfigDType(const fs::path& dir) {
  return json::parse(std::ifstream(dir / "config.json"))["torch_dtype"].get<std::string>();
}

float Rounded(float x, DType dtype) {
  uint16_t h;
  ConvertFromFloat(&x, &h, dtype, 1);
  float y;
  ConvertToFloat(&h, dtype, &y, 1);
  return y;
}

// Reads every parameter back in pieces of random sizes and compares each element.
void ExpectReadsBack(const fs::path& dir, const ModelConfig& m,
                     const std::map<std::string, std::vector<float>>& values, DType dtype) {
  const nn::HfCheckpoint ckpt(dir.string());
  const nn::HfFamily& family = nn::FindModelFamily(m.type).hf;
  const std::vector<nn::HfTensor> layout = family.layout(m);
  EXPECT_TRUE(nn::CheckHfTensors(ckpt, layout, family).empty());
  std::mt19937 rng(11);
  for (const nn::HfTensor& t : layout) {
    const std::vector<float>& want = values.at(t.param);
    const int64_t n = static_cast<int64_t>(want.size());
    std::vector<float> got(want.size(), -7.0f);
    for (int64_t begin = 0; begin < n;) {
      const int64_t count = std::min<int64_t>(n - begin, 1 + rng() % 40);
      nn::ReadHfParameter(ckpt, t, begin, count, got.data() + begin);
      begin += count;
    }
    for (int64_t i = 0; i < n; ++i) {
      const float w = dtype == DType::kF32 ? want[i] : Rounded(want[i], dtype);
      ASSERT_EQ(got[i], w) << t.param << " element " << i;
    }
  }
}

TEST(HfCheckpointTest, ShardedLlamaReadsBackExactly) {
  for (bool tied : {false, true}) {
    TempDir dir;
    const ModelConfig m = TinyLlama(tied);
    const auto values = RandomParameters(m);
    const int shards = Write(dir.path(), m, values, DType::kF32, 2000);
    EXPECT_GT(shards, 2);
    EXPECT_TRUE(fs::exists(fs::path(dir.path()) / "model.safetensors.index.json"));
    EXPECT_TRUE(fs::exists(fs::path(dir.path()) / ShardFile(1, shards)));
    EXPECT_TRUE(fs::exists(fs::path(dir.path()) / ShardFile(shards, shards)));
    EXPECT_FALSE(fs::exists(fs::path(dir.path()) / "model.safetensors"));
    ExpectReadsBack(dir.path(), m, values, DType::kF32);
    const json index = json::parse(std::ifstream(fs::path(dir.path()) / "model.safetensors.index.json"));
    int64_t total = 0;
    for (const nn::HfTensor& t : nn::FindModelFamily("llama").hf.layout(m)) {
      total += NumElements(t.hf_shape) * 4;
      EXPECT_TRUE(index["weight_map"].contains(t.hf_name)) << t.hf_name;
    }
    EXPECT_EQ(index["metadata"]["total_size"], total);
    EXPECT_EQ(index["weight_map"].contains("lm_head.weight"), !tied);
    // Written again unsharded, the old shards and index go.
    EXPECT_EQ(Write(dir.path(), m, values, DType::kF32, nn::kHfDefaultMaxShardBytes), 1);
    EXPECT_FALSE(fs::exists(fs::path(dir.path()) / "model.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(fs::path(dir.path()) / ShardFile(1, shards)));
    ExpectReadsBack(dir.path(), m, values, DType::kF32);
  }
}

TEST(HfCheckpointTest, SixteenBitTensorsWidenOnRead) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    TempDir dir;
    const ModelConfig m = TinyLlama(false);
    const auto values = RandomParameters(m);
    Write(dir.path(), m, values, dtype, 3000);
    ExpectReadsBack(dir.path(), m, values, dtype);
    EXPECT_EQ(ConfigDType(dir.path()), dtype == DType::kBF16 ? "bfloat16" : "float16");
  }
}

TEST(HfCheckpointTest, Gpt2ConvWeightsAreTransposedBothWays) {
  TempDir dir;
  const ModelConfig m = TinyGpt2();
  const auto values = RandomParameters(m);
  Write(dir.path(), m, values, DType::kF32, nn::kHfDefaultMaxShardBytes);
  ExpectReadsBack(dir.path(), m, values, DType::kF32);
  // On disk the Conv1D weight is [in, out]: HF element (c, r) is ztrain's (r, c).
  const nn::HfCheckpoint ckpt(dir.path());
  const nn::SafetensorsEntry* e = ckpt.Find("transformer.h.0.mlp.c_fc.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->shape, (Shape{m.n_embd, 4 * m.n_embd}));
  float x;
  ckpt.Read("transformer.h.0.mlp.c_fc.weight", 3 * 4 * m.n_embd + 5, 1, &x);
  EXPECT_EQ(x, values.at("h.0.mlp.c_fc.weight")[5 * m.n_embd + 3]);
  EXPECT_EQ(ckpt.Find("transformer.wte.weight")->shape, (Shape{m.vocab_size, m.n_embd}));
}

TEST(HfCheckpointTest, BrokenDirectoriesNameTheProblem) {
  const ModelConfig m = TinyLlama(false);
  const auto values = RandomParameters(m);
  const nn::HfFamily& family = nn::FindModelFamily("llama").hf;
  {
    TempDir dir;
    const int shards = Write(dir.path(), m, values, DType::kF32, 2000);
    const std::string second = ShardFile(2, shards);
    fs::remove(fs::path(dir.path()) / second);
    ExpectErrorWith<IoError>([&] { nn::HfCheckpoint ckpt(dir.path()); },
                             {second});
  }
  {
    TempDir dir;
    std::map<std::string, std::vector<float>> wrong = values;
    Write(dir.path(), m, wrong, DType::kF32, nn::kHfDefaultMaxShardBytes);
    ModelConfig bigger = m;
    bigger.intermediate_size = 16;
    const nn::HfCheckpoint ckpt(dir.path());
    ExpectErrorWith<IoError>([&] { nn::CheckHfTensors(ckpt, family.layout(bigger), family); },
                             {"model.layers.0.mlp.gate_proj.weight", "[12, 12]", "[16, 12]"});
    ModelConfig biased = m;
    biased.mlp_bias = true;
    ExpectErrorWith<IoError>([&] { nn::CheckHfTensors(ckpt, family.layout(biased), family); },
                             {"has no tensor 'model.layers.0.mlp.gate_proj.bias'"});
  }
  {
    TempDir dir;
    std::ofstream(fs::path(dir.path()) / "config.json") << R"({"model_type": "llama"})";
    ExpectErrorWith<IoError>([&] { nn::HfCheckpoint ckpt(dir.path()); },
                             {"neither model.safetensors nor model.safetensors.index.json"});
  }
  {
    TempDir dir;
    ExpectErrorWith<ConfigError>([&] { nn::ReadHfConfig(dir.path()); },
                                 {"without config.json"});
  }
}

// config.json through the adapters.
json ReadKeys(const json& hf, json* notes = nullptr) {
  json scratch = json::object();
  return nn::FindHfFamily(hf, "config.json").hf.read_config(hf, "config.json", notes ? notes : &scratch);
}

TEST(HfConfigTest, ReadsLlamaMistralQwen2AndGpt2) {
  const json llama = {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", 2048},
                      {"intermediate_size", 8192}, {"num_hidden_layers", 16},
                      {"num_attention_heads", 32}, {"num_key_value_heads", 8},
                      {"vocab_size", 128256}, {"max_position_embeddings", 131072},
                      {"rms_norm_eps", 1e-5}, {"rope_theta", 500000.0},
                      {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 32.0},
                                        {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                        {"original_max_position_embeddings", 8192}}},
                      {"tie_word_embeddings", true}, {"head_dim", 64}};
  const json k = ReadKeys(llama);
  EXPECT_EQ(k["type"], "llama");
  EXPECT_EQ(k["n_kv_head"], 8);
  EXPECT_EQ(k["head_dim"], 64);
  EXPECT_EQ(k["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(k["rope_scaling"]["factor"], 32.0);
  EXPECT_EQ(k["tie_word_embeddings"], true);
  EXPECT_EQ(k["qkv_bias"], false);

  json mistral = llama;
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral.erase("rope_scaling");
  mistral["sliding_window"] = 4096;
  json notes = json::object();
  const json km = ReadKeys(mistral, &notes);
  EXPECT_EQ(km["sliding_window"], 4096);  // every layer slides
  EXPECT_EQ(km["max_window_layers"], 0);
  EXPECT_EQ(km["max_seq_len"], 131072);  // the window no longer caps the context
  EXPECT_TRUE(notes.contains("sliding_window"));
  mistral["sliding_window"] = nullptr;
  EXPECT_EQ(ReadKeys(mistral)["sliding_window"], 0);

  json qwen = llama;
  qwen["architectures"] = {"Qwen2ForCausalLM"};
  qwen["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // the older key
  const json kq = ReadKeys(qwen);
  EXPECT_EQ(kq["qkv_bias"], true);
  EXPECT_EQ(kq["attention_bias"], false);
  EXPECT_EQ(kq["rope_scaling"]["rope_type"], "linear");
  // Qwen2 slides only with use_sliding_window, from max_window_layers on (HF's default 28).
  qwen["sliding_window"] = 4096;
  qwen["num_hidden_layers"] = 32;
  EXPECT_EQ(ReadKeys(qwen)["sliding_window"], 0);
  qwen["use_sliding_window"] = true;
  EXPECT_EQ(ReadKeys(qwen)["sliding_window"], 4096);
  EXPECT_EQ(ReadKeys(qwen)["max_window_layers"], 28);
  qwen["max_window_layers"] = 32;  // no layer at or past 32: none slides
  EXPECT_EQ(ReadKeys(qwen)["sliding_window"], 0);
  qwen["num_hidden_layers"] = 3;  // layer_types, when given, decides
  qwen["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention"};
  EXPECT_EQ(ReadKeys(qwen)["max_window_layers"], 1);
  qwen["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  ExpectErrorWith<ConfigError>([&] { ReadKeys(qwen); },
                               {"layer_types[1]", "full layers followed by sliding ones"});
  qwen.erase("layer_types");
  qwen["sliding_window"] = nullptr;
  ExpectErrorWith<ConfigError>([&] { ReadKeys(qwen); }, {"sliding_window is null"});

  const json gpt2 = {{"architectures", {"GPT2LMHeadModel"}}, {"n_embd", 768}, {"n_layer", 12},
                     {"n_head", 12}, {"vocab_size", 50257}, {"n_positions", 1024}};
  EXPECT_EQ(ReadKeys(gpt2)["type"], "gpt2");
  EXPECT_EQ(ReadKeys(gpt2)["max_seq_len"], 1024);
}

TEST(HfConfigTest, RefusesWhatNoFamilyRunsByName) {
  ExpectErrorWith<ConfigError>(
      [] { ReadKeys({{"architectures", {"FalconForCausalLM"}}, {"model_type", "falcon"}}); },
      {"FalconForCausalLM", "LlamaForCausalLM", "GPT2LMHeadModel"});
  const json base = {{"model_type", "llama"}, {"hidden_size", 64}, {"intermediate_size", 128},
                     {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                     {"vocab_size", 256}, {"max_position_embeddings", 64}};
  json gelu = base;
  gelu["hidden_act"] = "gelu";
  ExpectErrorWith<ConfigError>([&] { ReadKeys(gelu); }, {"hidden_act 'gelu'"});
  // YaRN and dynamic NTK run past max_position_embeddings: the context becomes factor x the
  // original one when that is longer; dynamic's original context is max_position_embeddings.
  json yarn = base;
  yarn["max_position_embeddings"] = 32768;  // Qwen2.5's 128k recipe
  yarn["rope_scaling"] = {
      {"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  const json ky = ReadKeys(yarn);
  EXPECT_EQ(ky["max_seq_len"], 131072);
  EXPECT_EQ(ky["rope_scaling"]["rope_type"], "yarn");
  yarn["rope_scaling"].erase("factor");  // DeepSeek-V3: the ratio of the contexts
  yarn["max_position_embeddings"] = 163840;
  yarn["rope_scaling"]["original_max_position_embeddings"] = 4096;
  EXPECT_EQ(ReadKeys(yarn)["rope_scaling"]["factor"], 40.0);
  json dynamic = base;
  dynamic["max_position_embeddings"] = 4096;
  dynamic["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  const json kd = ReadKeys(dynamic);
  EXPECT_EQ(kd["max_seq_len"], 8192);
  EXPECT_EQ(kd["rope_scaling"]["original_max_position_embeddings"], 4096);
  json longrope = base;
  longrope["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  ExpectErrorWith<ConfigError>([&] { ReadKeys(longrope); },
                               {"rope_scaling type 'longrope'", "yarn", "dynamic"});
  json no_layers = base;
  no_layers.erase("num_hidden_layers");
  ExpectErrorWith<ConfigError>([&] { ReadKeys(no_layers); }, {"no num_hidden_layers"});
  json text = base;
  text["hidden_size"] = "64";
  ExpectErrorWith<ConfigError>([&] { ReadKeys(text); }, {"hidden_size is \"64\"", "an integer"});
  ExpectErrorWith<ConfigError>(
      [] {
        ReadKeys({{"model_type", "gpt2"}, {"n_embd", 64}, {"n_layer", 2}, {"n_head", 4},
                  {"vocab_size", 256}, {"activation_function", "relu"}});
      },
      {"activation_function 'relu'"});
}

// write_config then read_config is the model again, for every variant a family writes.
TEST(HfConfigTest, WrittenConfigsReadBack) {
  std::vector<ModelConfig> models = {TinyGpt2(), TinyLlama(false), TinyLlama(true)};
  ModelConfig qwen = TinyLlama(true);
  qwen.attention_bias = false;
  qwen.qkv_bias = true;
  qwen.rope_scaling.type = "llama3";
  qwen.rope_scaling.factor = 8.0;
  qwen.rope_scaling.original_max_position_embeddings = 64;
  models.push_back(qwen);
  ModelConfig qwen_window = qwen;  // Qwen2's window from layer 1
  qwen_window.sliding_window = 4;
  qwen_window.max_window_layers = 1;
  models.push_back(qwen_window);
  ModelConfig mistral = TinyLlama(false);  // a window in every layer, no biases: Mistral
  mistral.attention_bias = false;
  mistral.sliding_window = 4;
  models.push_back(mistral);
  ModelConfig yarn = TinyLlama(false);  // YaRN with every key of its own
  yarn.rope_scaling.type = "yarn";
  yarn.rope_scaling.factor = 4.0;
  yarn.rope_scaling.original_max_position_embeddings = 2;  // x 4 = the context of 8
  yarn.rope_scaling.beta_fast = 16.0;
  yarn.rope_scaling.beta_slow = 2.0;
  yarn.rope_scaling.attention_factor = 1.25;
  models.push_back(yarn);
  ModelConfig dynamic = TinyLlama(false);  // dynamic NTK: HF's max_position_embeddings is 4
  dynamic.rope_scaling.type = "dynamic";
  dynamic.rope_scaling.factor = 2.0;
  dynamic.rope_scaling.original_max_position_embeddings = 4;
  models.push_back(dynamic);
  for (const ModelConfig& m : models) {
    const json hf = nn::FindModelFamily(m.type).hf.write_config(m, DType::kF32);
    json j = testing::TinyConfigJson();
    j["model"] = ReadKeys(hf);
    j["model"]["padded_vocab_size"] = m.padded_vocab_size;
    const ModelConfig back = ParseConfig(j).model;
    EXPECT_EQ(back.type, m.type);
    EXPECT_EQ(back.n_layer, m.n_layer);
    EXPECT_EQ(back.n_embd, m.n_embd);
    EXPECT_EQ(back.kv_heads(), m.kv_heads());
    EXPECT_EQ(back.head_size(), m.head_size());
    EXPECT_EQ(back.mlp_hidden(), m.mlp_hidden());
    EXPECT_EQ(back.max_seq_len, m.max_seq_len);
    EXPECT_EQ(back.vocab_size, m.vocab_size);
    EXPECT_EQ(back.norm_eps, m.norm_eps);
    EXPECT_EQ(back.rope_theta, m.rope_theta);
    EXPECT_EQ(back.rope_scaling.type, m.rope_scaling.type);
    EXPECT_EQ(back.rope_scaling.factor, m.rope_scaling.factor);
    EXPECT_EQ(back.attention_bias, m.attention_bias);
    EXPECT_EQ(back.qkv_bias, m.qkv_bias);
    EXPECT_EQ(back.mlp_bias, m.mlp_bias);
    EXPECT_EQ(back.tie_word_embeddings, m.tie_word_embeddings);
    EXPECT_EQ(back.sliding_window, m.sliding_window);
    if (m.rope_scaling.type == "yarn" || m.rope_scaling.type == "dynamic") {
      EXPECT_EQ(back.rope_scaling.original_max_position_embeddings,
                m.rope_scaling.original_max_position_embeddings);
      EXPECT_EQ(back.rope_scaling.beta_fast, m.rope_scaling.beta_fast);
      EXPECT_EQ(back.rope_scaling.beta_slow, m.rope_scaling.beta_slow);
      EXPECT_EQ(back.rope_scaling.attention_factor, m.rope_scaling.attention_factor);
    }
    EXPECT_EQ(back.max_window_layers, m.max_window_layers);
  }
  EXPECT_EQ(nn::FindModelFamily("llama").hf.write_config(mistral, DType::kF32)["architectures"],
            json::array({"MistralForCausalLM"}));
  // A window with biases, or in some layers only, is no HF class outside Qwen2.
  ModelConfig biased = mistral;
  biased.attention_bias = true;
  ExpectErrorWith<ConfigError>(
      [&] { nn::FindModelFamily("llama").hf.write_config(biased, DType::kF32); },
      {"sliding window", "neither a Mistral nor a Qwen2"});
  ModelConfig partial = mistral;
  partial.max_window_layers = 1;
  ExpectErrorWith<ConfigError>(
      [&] { nn::FindModelFamily("llama").hf.write_config(partial, DType::kF32); },
      {"from layer 1", "neither a Mistral nor a Qwen2"});
}

// A run's config from a HF directory: the directory gives the model; a key that disagrees
// names both values.
TEST(HfConfigTest, RunConfigTakesTheModelFromTheDirectory) {
  TempDir dir;
  const ModelConfig m = TinyLlama(false);
  Write(dir.path(), m, RandomParameters(m), DType::kF32, nn::kHfDefaultMaxShardBytes);
  json j = DefaultConfigJson();
  j["model"] = {{"init_from", dir.path()}};
  j["data"] = {{"seq_len", 8}};
  j["device"] = "cpu";
  const Config c = ResolveRunConfig(j, 1, LaunchEnv{});
  EXPECT_EQ(c.model.type, "llama");
  EXPECT_EQ(c.model.kv_heads(), m.kv_heads());
  EXPECT_EQ(c.model.head_size(), m.head_size());
  EXPECT_EQ(c.model.tie_word_embeddings, false);
  EXPECT_EQ(c.model.attention_bias, true);
  EXPECT_TRUE(PreflightProblems(c, {.open_data = false}).empty());
  // Weights that do not hold the model are found before the run, by check-config too.
  fs::remove(fs::path(dir.path()) / "model.safetensors");
  const std::vector<std::string> problems = PreflightProblems(c, {.open_data = false});
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("model.init_from: Hugging Face directory"), std::string::npos)
      << problems[0];
  j["model"]["n_kv_head"] = 4;
  j["model"]["type"] = "gpt2";
  ExpectErrorWith<ConfigError>([&] { ResolveRunConfig(j, 1, LaunchEnv{}); },
                               {"model.n_kv_head: the config says 4", "has 2",
                                "model.type: the config says \"gpt2\"", "\"llama\""});
}

// Both families through the engine: a trained model saved as a HF directory (save_final's
// writer) loads into a fresh engine as the same model, to the bit.
TEST(HfCheckpointTest, EngineSavesAndLoadsEitherFamily) {
  for (const json& model_json : {testing::TinyConfigJson(), testing::TinyLlamaConfigJson()}) {
    TempDir dir;
    const Config cfg = ParseConfig(model_json);
    Engine trained(cfg, nn::BuildModel(cfg.model));
    testing::OwnedBatch batch(2, 8, 11, 3);
    for (int step = 0; step < 3; ++step) trained.TrainStep({&batch.mb, 1});
    const std::string out = dir.path() + "/model/";
    SaveModelWeights(out, cfg, trained);
    EXPECT_TRUE(nn::IsHfModelDir(out));
    Engine loaded(cfg, nn::BuildModel(cfg.model));
    const LoadedWeights w = LoadModelWeights(out, cfg.model, loaded);
    EXPECT_EQ(w.format, "Hugging Face directory");
    EXPECT_EQ(w.bytes_read, w.bytes_in_file);
    EXPECT_EQ(loaded.EvalLoss(batch.mb), trained.EvalLoss(batch.mb)) << cfg.model.type;
    // Every element the HF tensors hold (not the vocabulary's padding rows, which no token
    // reaches and which load as zero).
    for (const nn::HfTensor& t : nn::FindModelFamily(cfg.model.type).hf.layout(cfg.model)) {
      const Tensor a = trained.Parameter(t.param), b = loaded.Parameter(t.param);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), NumElements(t.hf_shape) * sizeof(float)))
          << cfg.model.type << " " << t.param;
    }
  }
}

// An llm.c file holds GPT-2: another model.type beside it is refused by name.
TEST(HfConfigTest, AnLlmcFileIsGpt2) {
  TempDir dir;
  const Config gpt2 = ParseConfig(testing::TinyConfigJson());
  Engine engine(gpt2, nn::BuildModel(gpt2.model));
  const std::string file = (fs::path(dir.path()) / "model.bin").string();
  SaveModelWeights(file, gpt2, engine);
  json j = DefaultConfigJson();
  j["model"] = {{"init_from", file}};
  j["data"] = {{"seq_len", 8}};
  EXPECT_EQ(ResolveRunConfig(j, 1, LaunchEnv{}).model.n_embd, gpt2.model.n_embd);
  j["model"]["type"] = "llama";
  ExpectErrorWith<ConfigError>([&] { ResolveRunConfig(j, 1, LaunchEnv{}); },
                               {"is an llm.c model file, which holds GPT-2"});
}

}  // namespace
}  // namespace ztrain
