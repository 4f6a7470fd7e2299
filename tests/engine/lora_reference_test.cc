// LoRA against an independent PyTorch implementation of PEFT's LoRA on Hugging Face's Llama
// (tests/reference/hf_llama.py, written from PEFT's definitions):
//   - the reference writes a random tiny base model as a HF directory and a PEFT adapter
//     directory for it, with B non-zero (so every adapter matters from the first step);
//   - ztrain starts from {"model": {"init_from": BASE}, "lora": {"init_from": ADAPTER}} alone:
//     the lora section comes from adapter_config.json;
//   - the first batch's gradient of every trained tensor is within 1e-4 of the reference's
//     (relative to the tensor's largest), and 10 AdamW steps of the adapters give the
//     reference's losses and gradient norms within 1e-4 relative;
//   - the trained adapter, written as a PEFT directory (training.save_final's writer), holds
//     the reference's trained tensors within 1e-4 of each tensor's largest (but for the few
//     elements whose near-zero gradient lets rounding noise steer Adam: DriftOf), and the base
//     merged with it (the reference's merge of ztrain's adapter) evaluates in the reference
//     to ztrain's own eval loss;
//   - QLoRA: with a `quantization` section ztrain quantizes the base while loading, and the
//     reference (hf_llama.py --quant, bitsandbytes' algorithms in tests/reference/bnb_quant.py)
//     computes with bitsandbytes' dequantized weights: the same checks, and the trained
//     adapter over the quantized base evaluates in the reference as in ztrain.
// A wrong convention (scaling alpha / r against alpha / sqrt(r), A and B swapped or
// transposed, an adapter on the wrong window of the packed q/k/v, a bias trained that PEFT
// freezes) moves the first loss or a gradient by far more than 1e-4.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "nn/family.h"
#include "nn/hf_checkpoint.h"
#include "nn/peft.h"
#include "reference_util.h"
#include "run/model_weights.h"
#include "run/run_config.h"
#include "test_model.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kBatch = 4, kSeq = 32, kSteps = 10;
constexpr double kTolerance = 1e-4;

struct Case {
  std::string name;
  std::string arch;  // hf_llama.py --arch
  json hf;           // config.json keys over the reference's defaults
  std::string dtype;
  json lora;  // PEFT LoraConfig keys
  json quantization = nullptr;  // BitsAndBytesConfig keys: a quantized base (QLoRA)
};

// hf_llama.py's --quant arguments for a quantization section.
std::string QuantArgs(const json& q) {
  if (q.is_null()) return "";
  if (q.value("load_in_8bit", false)) return " --quant int8";
  return std::string(" --quant ") + q.value("bnb_4bit_quant_type", "fp4") +
         (q.value("bnb_4bit_use_double_quant", false) ? " --double-quant" : "");
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// A safetensors file's fp32 tensors by name.
std::map<std::string, std::vector<float>> ReadF32(const std::string& path) {
  const nn::SafetensorsHeader header = nn::ReadSafetensorsHeader(path);
  std::map<std::string, std::vector<float>> out;
  for (const nn::SafetensorsEntry& e : header.tensors) {
    EXPECT_EQ(e.dtype, "F32") << path << " " << e.name;
    const std::vector<char> raw = nn::ReadSafetensorsTensor(path, header, e.name);
    const float* p = reinterpret_cast<const float*>(raw.data());
    out[e.name].assign(p, p + raw.size() / sizeof(float));
  }
  return out;
}

// Largest |got - want| as a share of want's largest magnitude.
double WorstShare(const float* got, const std::vector<float>& want) {
  double scale = 0.0, worst = 0.0;
  for (float w : want) scale = std::max(scale, std::fabs(double{w}));
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::fabs(double{got[i]} - want[i]));
  }
  return worst / std::max(scale, 1e-30);
}

// A trained tensor against the reference's. Adam moves an element about lr a step, in the
// direction of m / sqrt(v) whatever the gradient's size; where the true gradient is near zero
// (k_proj's bias and the adapters feeding it: under RoPE a key's bias shifts a query's scores
// almost uniformly, which softmax ignores) that direction is set by the gradient's rounding
// noise (the 1e-6 of the tensor's largest that the gradient check measures), so two
// implementations exact to rounding part there by a fraction of lr a step. So: every element
// within kTolerance of the tensor's largest value, but for at most 1% of the elements (and at
// least 1), which must stay within kAdamNoiseShare of the distance Adam moves an element in the
// run (lr a step); a wrong gradient moves an element by about that whole distance.
constexpr double kLr = 1e-3;  // the runs' learning rate (ReferenceRunJson, --lr)
constexpr double kAdamNoiseShare = 0.01;

struct TrainedDrift {
  double worst_share = 0.0;    // the largest |got - want| over the tensor's largest |want|
  int64_t outliers = 0;        // elements beyond kTolerance of it
  double worst_outlier = 0.0;  // their largest |got - want|
};

TrainedDrift DriftOf(const float* got, const std::vector<float>& want) {
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, std::fabs(double{w}));
  scale = std::max(scale, 1e-30);
  TrainedDrift d;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = std::fabs(double{got[i]} - want[i]);
    d.worst_share = std::max(d.worst_share, diff / scale);
    if (diff > kTolerance * scale) {
      ++d.outliers;
      d.worst_outlier = std::max(d.worst_outlier, diff);
    }
  }
  return d;
}

class LoraReferenceTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    python_ = testing::TorchPython();
    if (python_.empty()) GTEST_SKIP() << "no python3 with torch (Debian's python3-torch)";
    dir_ = fs::temp_directory_path() /
           ("ztrain_lora_reference_" + GetParam().name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    tokens_ = std::make_unique<testing::ReferenceTokens>(dir_ / "tokens.i32", kSteps, kBatch,
                                                         kSeq, 4321);
    const Case& c = GetParam();
    Reference("make-model --out " + Quote(path("base")) + " --arch " + c.arch + " --config-json " +
              Quote(c.hf.dump()) + " --dtype " + c.dtype + " --seed 5");
    Reference("make-adapter --model " + Quote(path("base")) + " --out " + Quote(path("adapter")) +
              " --lora-json " + Quote(c.lora.dump()) + " --seed 7 --b-std 0.05");
  }
  void TearDown() override {
    if (!dir_.empty() && !std::getenv("KEEP")) fs::remove_all(dir_);
  }
  void Reference(const std::string& args) const { testing::RunReference(python_, args); }
  static std::string Quote(const std::string& s) { return testing::ShellQuote(s); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string Data() const {
    return " --tokens " + Quote(path("tokens.i32")) + " --batch " + std::to_string(kBatch) +
           " --seq " + std::to_string(kSeq) + " --threads 2";
  }

  // The run's config: the base and the adapter only from their directories.
  Config RunConfig() const {
    json j = testing::ReferenceRunJson(kBatch, kSeq);
    j["model"] = {{"init_from", path("base")}};
    j["lora"] = {{"init_from", path("adapter")}};
    if (!GetParam().quantization.is_null()) j["quantization"] = GetParam().quantization;
    return ResolveRunConfig(j, 1, LaunchEnv{});
  }
  nn::MicroBatch Batch(int64_t k) { return tokens_->Batch(k); }

  std::string python_;
  fs::path dir_;
  std::unique_ptr<testing::ReferenceTokens> tokens_;
};

TEST_P(LoraReferenceTest, GradientsLossesAndAdapterMatchThePeftReference) {
  Reference("train --model " + Quote(path("base")) + " --adapter " + Quote(path("adapter")) +
            Data() + " --steps " + std::to_string(kSteps) +
            " --lr 1e-3 --weight-decay 0.1 --eps 1e-8 --out " + Quote(path("ref.json")) +
            " --grads " + Quote(path("grads.safetensors")) + " --save-adapter " +
            Quote(path("ref_adapter")) + QuantArgs(GetParam().quantization));
  const json ref = testing::ReadJsonFile(dir_ / "ref.json");
  const Config cfg = RunConfig();
  ASSERT_TRUE(cfg.lora.enabled);
  EXPECT_EQ(cfg.lora.r, GetParam().lora.at("r").get<int>()) << "from adapter_config.json";
  Engine engine(
      cfg, nn::BuildModel(cfg.model, nn::MakeWholeLinears(), nn::AdapterPlan(cfg)));
  LoadModelWeights(cfg.model.init_from, cfg.model, engine);
  const LoadedWeights adapter = LoadPeftAdapter(cfg.lora.init_from, cfg, engine);
  EXPECT_EQ(adapter.bytes_read, adapter.bytes_in_file);

  // The first batch's gradients of every trained tensor, by its PEFT name.
  const std::vector<nn::HfTensor> layout = nn::PeftLayout(cfg.model, cfg.lora);
  const auto grads = ReadF32(path("grads.safetensors"));
  engine.ZeroGrad();
  engine.ForwardBackward(Batch(0), 1.0f);
  double worst_gradient = 0.0;
  for (const nn::HfTensor& t : layout) {
    const double share = WorstShare(engine.Gradient(t.param).data<float>(), grads.at(t.hf_name));
    EXPECT_LE(share, kTolerance) << t.hf_name;
    worst_gradient = std::max(worst_gradient, share);
  }
  EXPECT_EQ(static_cast<int64_t>(layout.size()), static_cast<int64_t>(grads.size()));
  EXPECT_LT(engine.NumTrainableParameters(), engine.NumParameters() / 2);
  engine.ZeroGrad();

  double worst_loss = 0.0;
  for (int64_t k = 0; k < kSteps; ++k) {
    const nn::MicroBatch mb = Batch(k);
    const StepStats s = engine.TrainStep(std::span<const nn::MicroBatch>(&mb, 1));
    const double want = ref["losses"][k].get<double>();
    EXPECT_NEAR(s.loss, want, kTolerance * std::fabs(want)) << "step " << k + 1;
    worst_loss = std::max(worst_loss, std::fabs(s.loss - want) / std::fabs(want));
    const double norm = ref["grad_norms"][k].get<double>();
    EXPECT_NEAR(s.grad_norm, norm, kTolerance * norm) << "step " << k + 1;
  }

  // The trained adapter as a PEFT directory, against the reference's.
  SaveModelWeights(path("trained"), cfg, engine);
  const auto mine = ReadF32(path("trained") + "/adapter_model.safetensors");
  const auto theirs = ReadF32(path("ref_adapter") + "/adapter_model.safetensors");
  ASSERT_EQ(mine.size(), theirs.size());
  double worst_tensor = 0.0;
  for (const auto& [name, want] : theirs) {
    ASSERT_EQ(mine.count(name), 1u) << name << " missing from ztrain's adapter";
    ASSERT_EQ(mine.at(name).size(), want.size()) << name;
    const TrainedDrift drift = DriftOf(mine.at(name).data(), want);
    EXPECT_LE(drift.outliers, std::max<int64_t>(1, static_cast<int64_t>(want.size()) / 100))
        << name << ": elements beyond " << kTolerance << " of the tensor's largest";
    EXPECT_LE(drift.worst_outlier, kAdamNoiseShare * kLr * kSteps)
        << name << ": an element's distance against the distance Adam moves one in " << kSteps
        << " steps";
    worst_tensor = std::max(worst_tensor, drift.worst_share);
  }
  const json config = testing::ReadJsonFile(fs::path(path("trained")) / "adapter_config.json");
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], cfg.lora.r);

  // The base merged with ztrain's adapter (by the reference) evaluates as ztrain does; over a
  // quantized base, the reference evaluates ztrain's adapter over its own quantized base.
  if (GetParam().quantization.is_null()) {
    Reference("merge --model " + Quote(path("base")) + " --adapter " + Quote(path("trained")) +
              " --out " + Quote(path("merged")));
    Reference("eval --model " + Quote(path("merged")) + Data() + " --batches 2 --out " +
              Quote(path("eval.json")));
  } else {
    Reference("eval --model " + Quote(path("base")) + " --adapter " + Quote(path("trained")) +
              QuantArgs(GetParam().quantization) + Data() + " --batches 2 --out " +
              Quote(path("eval.json")));
  }
  double ours = 0.0;
  for (int64_t k = 0; k < 2; ++k) ours += engine.EvalLoss(Batch(k)) / 2.0;
  const double merged = testing::ReadJsonFile(dir_ / "eval.json")["loss"].get<double>();
  EXPECT_NEAR(ours, merged, 1e-5 * merged);
  std::printf(
      "%s: worst gradient %.2e of its tensor's largest, worst loss %.2e relative over "
      "%lld steps, worst trained tensor %.2e; merged eval %.7f vs ztrain %.7f\n",
      GetParam().name.c_str(), worst_gradient, worst_loss, static_cast<long long>(kSteps),
      worst_tensor, merged, ours);
}

INSTANTIATE_TEST_SUITE_P(
    Models, LoraReferenceTest,
    ::testing::Values(
        Case{"llama_gqa_every_linear_f32",
             "llama",
             {{"num_key_value_heads", 2}, {"tie_word_embeddings", false}, {"head_dim", 8}},
             "F32",
             {{"r", 4},
              {"lora_alpha", 8},
              {"target_modules",
               {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}}}},
        Case{"qwen2_tied_bf16_qv_rslora_biases_layer1",
             "qwen2",
             {{"num_key_value_heads", 1}, {"tie_word_embeddings", true}},
             "BF16",
             {{"r", 2},
              {"lora_alpha", 6},
              {"use_rslora", true},
              {"target_modules", {"q_proj", "v_proj"}},
              {"layers_to_transform", {1}},
              {"bias", "all"}}},
        Case{"llama_all_linear_head_saved",
             "llama",
             {{"tie_word_embeddings", false}},
             "F32",
             {{"r", 3},
              {"lora_alpha", 3},
              {"target_modules", "all-linear"},
              {"modules_to_save", {"lm_head"}}}},
        Case{"llama_qlora_nf4_every_linear_f32",
             "llama",
             {{"num_key_value_heads", 2}, {"tie_word_embeddings", false}},
             "F32",
             {{"r", 4}, {"lora_alpha", 8}, {"target_modules", "all-linear"}},
             {{"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"}}},
        Case{"llama_qlora_nf4_double_quant_qv_f32",
             "llama",
             {{"tie_word_embeddings", false}},
             "F32",
             {{"r", 2}, {"lora_alpha", 4}, {"target_modules", {"q_proj", "v_proj"}}},
             {{"load_in_4bit", true},
              {"bnb_4bit_quant_type", "nf4"},
              {"bnb_4bit_use_double_quant", true}}},
        Case{"qwen2_qlora_int8_biases_f32",
             "qwen2",
             {{"num_key_value_heads", 1}, {"tie_word_embeddings", true}},
             "F32",
             {{"r", 2}, {"lora_alpha", 4}, {"target_modules", "all-linear"}, {"bias", "all"}},
             {{"load_in_8bit", true}}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace ztrain
