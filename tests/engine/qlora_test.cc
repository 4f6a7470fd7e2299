// A quantized base under LoRA (Note [Quantized base], nn/adapters.h): the engine keeps each
// quantized weight as its blob and the linears compute with bitsandbytes' dequantized values,
// so a QLoRA engine trains exactly as a LoRA engine whose base IS those values — the same
// losses and adapters to the last bit, for NF4, FP4, double quantization and INT8, on Llama
// (packed q/k/v) and GPT-2 (fused c_attn, tied head). The quantized base takes the blobs'
// bytes (NF4: 0.5625 bytes a weight) where the plain base takes 4; llm_int8_skip_modules
// leaves linears in the compute dtype; the config and the plan name what they refuse.
#include <gtest/gtest.h>

#include <map>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "estimate/shape_only.h"
#include "nn/family.h"
#include "parallel/comm/communicator.h"
#include "parallel/tensor/megatron_linears.h"
#include "test_model.h"
#include "tests/expect_error.h"

namespace ztrain {
namespace {

struct QuantCase {
  std::string name;
  bool llama;
  nlohmann::json quantization;
};

void PrintTo(const QuantCase& c, std::ostream* os) { *os << c.name; }

nlohmann::json CaseJson(const QuantCase& c, bool quantized) {
  nlohmann::json j = c.llama ? testing::TinyLlamaConfigJson() : testing::TinyConfigJson();
  j["lora"] = {{"r", 2},
               {"lora_alpha", 4},
               {"target_modules", "all-linear"},
               {"bias", "all"},
               {"init_lora_weights", false}};
  if (quantized) j["quantization"] = c.quantization;
  return j;
}

Engine Make(const Config& cfg) {
  return Engine(cfg, nn::BuildModel(cfg.model, nn::MakeWholeLinears(), nn::AdapterPlan(cfg)));
}

// Every parameter's whole fp32 value (a quantized one dequantized).
std::map<std::string, std::vector<float>> Values(Engine& e) {
  std::map<std::string, std::vector<float>> out;
  e.ForEachFullParameter([&](const std::string& name, const Tensor& t) {
    out[name].assign(t.data<float>(), t.data<float>() + t.numel());
  });
  return out;
}

class QloraTest : public ::testing::TestWithParam<QuantCase> {};

TEST_P(QloraTest, TrainsAsTheDequantizedBaseToTheLastBit) {
  const Config qcfg = ParseConfig(CaseJson(GetParam(), true));
  const Config plain_cfg = ParseConfig(CaseJson(GetParam(), false));
  Engine quantized = Make(qcfg);
  Engine plain = Make(plain_cfg);
  // Both start from the seed's weights; the plain engine's base becomes the dequantized one.
  const std::map<std::string, std::vector<float>> start = Values(quantized);
  int n_quantized = 0;
  for (const std::string& name : quantized.ParameterNames()) {
    const bool q = quantized.Parameter(name).dtype() == DType::kU8;
    n_quantized += q;
    if (!q) continue;
    ASSERT_FALSE(quantized.Trainable(name));
    // The dequantized weight is near the seed's (which the plain engine holds now) and not it.
    const Tensor seed = plain.Parameter(name);
    const std::vector<float>& deq = start.at(name);
    double worst = 0.0, differ = 0.0;
    for (int64_t i = 0; i < seed.numel(); ++i) {
      const double d = std::abs(deq[i] - seed.data<float>()[i]);
      worst = std::max(worst, d);
      differ += d > 0.0;
    }
    EXPECT_GT(differ, 0) << name;
    EXPECT_LT(worst, 0.05) << name;  // seed std 0.02: |w| < ~0.1, codebook steps < 0.5 absmax
  }
  EXPECT_EQ(n_quantized, GetParam().llama ? 2 * 7 : 2 * 4);
  plain.SetFullParameters([&](const std::string& name, const Tensor& t) {
    const std::vector<float>& v = start.at(name);
    std::copy(v.begin(), v.end(), t.data<float>());
  });
  testing::OwnedBatch batch(2, 7, 11, 9);
  const std::span<const nn::MicroBatch> mbs(&batch.mb, 1);
  EXPECT_EQ(quantized.EvalLoss(batch.mb), plain.EvalLoss(batch.mb));
  for (int step = 0; step < 3; ++step) {
    EXPECT_EQ(quantized.TrainStep(mbs).loss, plain.TrainStep(mbs).loss) << "step " << step;
  }
  const std::map<std::string, std::vector<float>> q_end = Values(quantized), p_end = Values(plain);
  for (const auto& [name, v] : q_end) EXPECT_EQ(v, p_end.at(name)) << name;
  // The base did not move.
  for (const std::string& name : quantized.ParameterNames()) {
    if (!quantized.Trainable(name)) {
      EXPECT_EQ(q_end.at(name), start.at(name)) << name;
    }
  }
}

const QuantCase kCases[] = {
    {"llama_nf4", true, {{"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"}}},
    {"llama_nf4_double_quant",
     true,
     {{"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"}, {"bnb_4bit_use_double_quant", true}}},
    {"llama_fp4_default_type", true, {{"load_in_4bit", true}}},
    {"llama_int8", true, {{"load_in_8bit", true}}},
    {"gpt2_nf4_double_quant",
     false,
     {{"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"}, {"bnb_4bit_use_double_quant", true}}},
    {"gpt2_int8", false, {{"load_in_8bit", true}}},
};

INSTANTIATE_TEST_SUITE_P(Cases, QloraTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

// The frozen base's bytes: NF4 keeps n / 2 bytes of codes and 4 bytes of absmax per 64
// weights (0.5625 bytes a weight), double quantization 1 byte per 64 and 4 bytes per 16384
// instead, INT8 n bytes and 4 per row, where the fp32 LoRA base keeps 4 bytes a weight. The
// tiny model's weights are small, so padding (16 elements a parameter, 64 bytes a region) is
// bounded and counted.
TEST(QloraMemoryTest, TheBaseTakesTheQuantizedBytes) {
  nlohmann::json j = testing::TinyLlamaConfigJson(2, 11, 8);
  j["model"]["n_embd"] = 64;
  j["model"]["intermediate_size"] = 128;
  j["model"]["head_dim"] = 16;
  j["lora"] = {{"r", 2}, {"target_modules", "all-linear"}};
  const Config plain_cfg = ParseConfig(j);
  Engine plain = Make(plain_cfg);
  struct Expect {
    nlohmann::json quantization;
    double bytes_per_weight;  // blob bytes per weight for these shapes (no short blocks)
  };
  const Expect expects[] = {
      {{{"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"}}, 0.5 + 4.0 / 64},
      {{{"load_in_4bit", true}, {"bnb_4bit_use_double_quant", true}}, 0.5 + 1.0 / 64},
      {{{"load_in_8bit", true}}, 1.0},
  };
  for (const Expect& e : expects) {
    j["quantization"] = e.quantization;
    const Config cfg = ParseConfig(j);
    Engine quantized = Make(cfg);
    int64_t weights = 0, rows = 0, tensors = 0;
    for (const std::string& name : quantized.ParameterNames()) {
      if (quantized.Parameter(name).dtype() != DType::kU8) continue;
      const Shape s = quantized.ParameterShape(name);
      weights += s[0] * s[1];
      rows += s[0];
      ++tensors;
    }
    ASSERT_EQ(tensors, 2 * 7);
    double expected_saving = (4.0 - e.bytes_per_weight) * static_cast<double>(weights);
    if (e.quantization.contains("load_in_8bit")) expected_saving -= 4.0 * rows;  // row absmax
    // Double quantization: the scales and offset, 8 bytes per tensor here (< 256 blocks).
    if (e.quantization.contains("bnb_4bit_use_double_quant")) expected_saving -= 8.0 * tensors;
    const double saving =
        static_cast<double>(plain.memory().Current(MemoryCategory::kParameters) -
                            quantized.memory().Current(MemoryCategory::kParameters));
    // Padding: each blob and value run starts on a 64-byte boundary, each region is padded to
    // 64 bytes; 4 regions (2 blocks, their 2 norms' layers hold no base linear).
    const double slack = 64.0 * (2 * tensors + 4);
    EXPECT_NEAR(saving, expected_saving, slack) << e.quantization.dump();
    EXPECT_GT(saving, 0.8 * expected_saving) << e.quantization.dump();
  }
}

TEST(QloraTest, SkippedModulesStayInTheComputeDType) {
  nlohmann::json j = testing::TinyLlamaConfigJson();
  j["lora"] = {{"r", 2}, {"target_modules", "all-linear"}};
  j["quantization"] = {{"load_in_4bit", true},
                       {"bnb_4bit_quant_type", "nf4"},
                       {"llm_int8_skip_modules", {"mlp", "model.layers.1.self_attn.o_proj"}}};
  const Config cfg = ParseConfig(j);
  Engine e = Make(cfg);
  std::vector<std::string> quantized;
  for (const std::string& name : e.ParameterNames()) {
    if (e.Parameter(name).dtype() == DType::kU8) quantized.push_back(name);
  }
  // Block 0: q, k, v, o; block 1: q, k, v (its o_proj skipped); no MLP weight.
  EXPECT_EQ(quantized.size(), 7u) << ::testing::PrintToString(quantized);
  for (const std::string& name : quantized) {
    EXPECT_EQ(name.find("mlp"), std::string::npos) << name;
    EXPECT_EQ(name.find("1.self_attn.o_proj"), std::string::npos) << name;
  }
}

TEST(QloraConfigTest, RefusalsNameTheKeyAndTheFix) {
  auto parse = [](nlohmann::json quantization, bool lora = true, bool bf16 = false) {
    nlohmann::json j = testing::TinyLlamaConfigJson();
    if (lora) j["lora"] = {{"r", 2}};
    j["quantization"] = std::move(quantization);
    if (bf16) j["bf16"] = {{"enabled", true}};
    return ParseConfig(j);
  };
  using testing::ExpectErrorWith;
  ExpectErrorWith<ConfigError>([&] { parse({{"load_in_4bit", true}}, /*lora=*/false); },
                               {"quantization.load_in_4bit", "nothing would train", "lora"});
  ExpectErrorWith<ConfigError>(
      [&] { parse({{"load_in_4bit", true}, {"load_in_8bit", true}}); },
      {"quantization.load_in_8bit", "choose one"});
  ExpectErrorWith<ConfigError>([&] { parse({{"bnb_4bit_quant_type", "nf4"}}); },
                               {"quantization.bnb_4bit_quant_type", "load_in_4bit is false"});
  ExpectErrorWith<ConfigError>(
      [&] { parse({{"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf8"}}); },
      {"quantization.bnb_4bit_quant_type", "nf4", "fp4"});
  ExpectErrorWith<ConfigError>(
      [&] { parse({{"load_in_4bit", true}, {"bnb_4bit_compute_dtype", "float32"}}, true, true); },
      {"quantization.bnb_4bit_compute_dtype", "bfloat16", "bf16.enabled"});
  ExpectErrorWith<ConfigError>(
      [&] { parse({{"load_in_8bit", true}, {"llm_int8_threshold", 0.0}}); },
      {"quantization.llm_int8_threshold", "6.0"});
  ExpectErrorWith<ConfigError>(
      [&] { parse({{"load_in_8bit", true}, {"llm_int8_has_fp16_weight", true}}); },
      {"quantization.llm_int8_has_fp16_weight", "lora"});
  ExpectErrorWith<ConfigError>([&] { parse({{"load_in_4bit", true}, {"bnb_4bit_quant_typ", "nf4"}}); },
                               {"bnb_4bit_quant_typ", "bnb_4bit_quant_type"});
  // Accepted: transformers' BitsAndBytesConfig.to_dict() of a QLoRA run, less the private keys.
  const Config ok = parse({{"quant_method", "bitsandbytes"},
                           {"load_in_4bit", true},
                           {"load_in_8bit", false},
                           {"bnb_4bit_quant_type", "nf4"},
                           {"bnb_4bit_use_double_quant", true},
                           {"bnb_4bit_compute_dtype", "bfloat16"},
                           {"bnb_4bit_quant_storage", "uint8"},
                           {"llm_int8_threshold", 6.0},
                           {"llm_int8_skip_modules", nullptr},
                           {"llm_int8_has_fp16_weight", false},
                           {"llm_int8_enable_fp32_cpu_offload", false}},
                          true, true);
  EXPECT_EQ(ok.quantization.type, "nf4");
  EXPECT_TRUE(ok.quantization.double_quant);
  EXPECT_EQ(parse({{"load_in_4bit", true}}).quantization.type, "fp4");  // bitsandbytes' default
  EXPECT_FALSE(parse({{"load_in_8bit", false}}).quantization.enabled());
}

TEST(QloraConfigTest, PlanRefusalsNameTheFix) {
  nlohmann::json j = testing::TinyLlamaConfigJson();
  j["lora"] = {{"r", 2}, {"target_modules", "all-linear"}};
  j["quantization"] = {{"load_in_4bit", true}, {"llm_int8_skip_modules", {"k_proj"}}};
  Config cfg = ParseConfig(j);
  testing::ExpectErrorWith<ConfigError>(
      [&] { nn::BuildModel(cfg.model, nn::MakeWholeLinears(), nn::AdapterPlan(cfg)); },
      {"llm_int8_skip_modules", "q_proj", "k_proj", "one GEMM"});
  // 4-bit blocks may not straddle tensor-parallel pieces: n_embd 12 has no whole 64-block.
  j["quantization"] = {{"load_in_4bit", true}};
  cfg = ParseConfig(j);
  detail::ShapeOnlyGroup tp(2, 0);
  testing::ExpectErrorWith<ConfigError>(
      [&] { tensor::BuildParallelModel(cfg.model, tp, nn::AdapterPlan(cfg)); },
      {"quantization.load_in_4bit", "tensor_parallel_size = 2", "multiple of 64",
       "llm_int8_skip_modules"});
  // INT8 has one scale per row: any split works.
  j["quantization"] = {{"load_in_8bit", true}};
  cfg = ParseConfig(j);
  tensor::BuildParallelModel(cfg.model, tp, nn::AdapterPlan(cfg));
}

}  // namespace
}  // namespace ztrain
