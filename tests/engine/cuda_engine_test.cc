// The engine on a CUDA device against the same engine on the CPU (Note [Devices in the
// engine]): one micro-batch's loss and every gradient, then training at every ZeRO stage and
// offload mode, step by step, and the weights at the end; then bf16 and fp16 (with loss
// scaling) training against the CPU's in the same precision, within Note [Equivalence
// tolerances]. Skips without a GPU (except the test that a missing GPU is named).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kernels/ops.h"
#include "nn/family.h"
#include "nn/gpt2.h"
#include "side_by_side.h"
#include "test_model.h"

namespace ztrain {
namespace {

// fp32 on both, but the GPU sums in other orders (GEMM tiles, attention blocks, reductions).
constexpr double kLossTolerance = 1e-5;   // relative, one forward
constexpr double kGradTolerance = 1e-4;   // relative to the tensor's largest magnitude
constexpr double kTrainTolerance = 2e-4;  // relative, after 10 AdamW steps

struct Layout {
  int stage = 0;
  std::string offload_optimizer = "none", offload_param = "none";
};
void PrintTo(const Layout& l, std::ostream* os) {
  *os << "stage " << l.stage << ", offload_optimizer " << l.offload_optimizer << ", offload_param "
      << l.offload_param;
}

// precision: "fp32", or "bf16" / "fp16" (DeepSpeed's sections, dynamic loss scaling for fp16);
// `extra`: more top-level sections (lora).
Config MakeConfig(const std::string& device, const Layout& layout, const std::string& nvme_dir,
                  const std::string& precision = "fp32",
                  const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json j = testing::TinyConfigJson(2, 32, 4, 11, 8);
  j["device"] = device;
  if (precision != "fp32") j[precision] = {{"enabled", true}};
  j["train_micro_batch_size_per_gpu"] = 4;
  j["gradient_accumulation_steps"] = 2;
  j.erase("train_batch_size");
  j["gradient_clipping"] = 1.0;
  j["optimizer"]["params"]["weight_decay"] = 0.1;
  j["zero_optimization"] = {{"stage", layout.stage}, {"sub_group_size", 2000}};
  for (const auto& [section, where] : {std::pair{"offload_optimizer", layout.offload_optimizer},
                                       std::pair{"offload_param", layout.offload_param}}) {
    if (where == "none") continue;
    j["zero_optimization"][section] = {{"device", where}, {"pin_memory", true}};
    if (where == "nvme") j["zero_optimization"][section]["nvme_path"] = nvme_dir;
  }
  j["training"]["job_name"] = "cuda_engine_test";
  for (const auto& [key, value] : extra.items()) j[key] = value;
  return ParseConfig(j);
}

std::map<std::string, std::vector<float>> Weights(Engine& e) {
  std::map<std::string, std::vector<float>> out;
  e.ForEachFullParameter([&](const std::string& name, const Tensor& t) {
    out[name].assign(t.data<float>(), t.data<float>() + t.numel());
  });
  return out;
}

// Calls fn(name, got, want) for every whole parameter of the two engines, having checked that
// they hold the same names and sizes.
template <typename Fn>
void ForEachWeightPair(Engine& gpu, Engine& cpu, Fn fn) {
  const auto want = Weights(cpu);
  const auto got = Weights(gpu);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    ASSERT_EQ(got.count(name), 1u) << name;
    const std::vector<float>& g = got.at(name);
    ASSERT_EQ(g.size(), w.size()) << name;
    fn(name, g, w);
  }
}

std::vector<float> OnHost(Engine& e, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  e.ops().Copy(t, Tensor(out.data(), DType::kF32, t.shape()));
  e.ops().Synchronize();
  return out;
}

class CudaEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    nvme_dir_ = "/tmp/ztrain_cuda_engine_" + std::to_string(getpid());
    std::filesystem::create_directories(nvme_dir_);
  }
  void TearDown() override {
    if (!nvme_dir_.empty()) std::filesystem::remove_all(nvme_dir_);
  }
  std::string nvme_dir_;
};

TEST_F(CudaEngineTest, LossAndGradientsMatchTheCpu) {
  const Layout plain;
  const Config cpu_config = MakeConfig("cpu", plain, nvme_dir_);
  Engine cpu(cpu_config, nn::BuildGpt2(cpu_config.model));
  const Config gpu_config = MakeConfig("cuda:0", plain, nvme_dir_);
  Engine gpu(gpu_config, nn::BuildGpt2(gpu_config.model));
  ASSERT_EQ(gpu.device(), Device::Cuda(0));
  testing::OwnedBatch batch(4, 8, 11, 7);
  const double want = cpu.ForwardBackward(batch.mb, 1.0f);
  const double got = gpu.ForwardBackward(batch.mb, 1.0f);
  EXPECT_NEAR(got, want, kLossTolerance * want);
  for (const std::string& name : cpu.ParameterNames()) {
    ASSERT_FALSE(gpu.Gradient(name).device().is_cpu()) << name;
    const std::vector<float> g = OnHost(gpu, gpu.Gradient(name));
    const Tensor e = cpu.Gradient(name);
    double largest = 0.0;
    for (int64_t i = 0; i < e.numel(); ++i) {
      largest = std::max(largest, std::fabs(static_cast<double>(e.data<float>()[i])));
    }
    for (int64_t i = 0; i < e.numel(); ++i) {
      ASSERT_NEAR(g[static_cast<size_t>(i)], e.data<float>()[i], kGradTolerance * largest + 1e-9)
          << name << "[" << i << "]";
    }
  }
}

class CudaTrainingTest : public CudaEngineTest, public ::testing::WithParamInterface<Layout> {};

TEST_P(CudaTrainingTest, TenStepsMatchTheCpu) {
  const Layout layout = GetParam();
  const Config cpu_config = MakeConfig("cpu", Layout{}, nvme_dir_);
  Engine cpu(cpu_config, nn::BuildGpt2(cpu_config.model));
  const Config gpu_config = MakeConfig("cuda:0", layout, nvme_dir_);
  Engine gpu(gpu_config, nn::BuildGpt2(gpu_config.model));
  for (int step = 0; step < 10; ++step) {
    testing::OwnedBatch a(4, 8, 11, 100 + step), b(4, 8, 11, 200 + step);
    const std::vector<nn::MicroBatch> micro{a.mb, b.mb};
    const StepStats want = cpu.TrainStep(micro);
    const StepStats got = gpu.TrainStep(micro);
    ASSERT_NEAR(got.loss, want.loss, kTrainTolerance * want.loss) << "step " << step;
    ASSERT_NEAR(got.grad_norm, want.grad_norm, kTrainTolerance * want.grad_norm) << "step " << step;
  }
  ForEachWeightPair(gpu, cpu, [](const std::string& name, const std::vector<float>& g,
                                 const std::vector<float>& w) {
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_NEAR(g[i], w[i], kTrainTolerance * (1.0 + std::fabs(w[i]))) << name << "[" << i << "]";
    }
  });
  // The evaluation path (forward only, stage-3 gathers without backward) agrees as well.
  testing::OwnedBatch eval(4, 8, 11, 99);
  EXPECT_NEAR(gpu.EvalLoss(eval.mb), cpu.EvalLoss(eval.mb), kTrainTolerance);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaTrainingTest,
                         ::testing::Values(Layout{0}, Layout{1}, Layout{2}, Layout{3},
                                           Layout{1, "cpu"}, Layout{2, "nvme"},
                                           Layout{3, "cpu", "cpu"}, Layout{3, "nvme", "nvme"},
                                           Layout{3, "none", "cpu"}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return "stage" + std::to_string(info.param.stage) + "_opt_" +
                                  info.param.offload_optimizer + "_param_" +
                                  info.param.offload_param;
                         });

// Mixed precision on the GPU (Note [Mixed dtypes on CUDA] in kernels/cuda/widen.h): the same
// config on both backends, bf16 or fp16 compute with fp32 masters. Both round the same fp32
// results to 16 bits, in other summation orders, which is the rounding model's 16-bit case
// (Note [Equivalence tolerances] (2)): losses, gradient norms and weights within it.
struct MixedCase {
  const char* name;
  const char* precision;  // "bf16" or "fp16"
  Layout layout;
};
void PrintTo(const MixedCase& c, std::ostream* os) { *os << c.name; }

class CudaMixedPrecisionTest : public CudaEngineTest,
                               public ::testing::WithParamInterface<MixedCase> {};

TEST_P(CudaMixedPrecisionTest, TenStepsMatchTheCpu) {
  const MixedCase& c = GetParam();
  const Config cpu_config = MakeConfig("cpu", Layout{}, nvme_dir_, c.precision);
  const Config gpu_config = MakeConfig("cuda:0", c.layout, nvme_dir_, c.precision);
  Engine cpu(cpu_config, nn::BuildGpt2(cpu_config.model));
  Engine gpu(gpu_config, nn::BuildGpt2(gpu_config.model));
  constexpr int kSteps = 10;
  testing::EquivalenceCheck check = testing::CheckFor(cpu, 4, 2, kSteps);
  double lr_sum = 0.0;
  for (int step = 0; step < kSteps; ++step) {
    testing::OwnedBatch a(4, 8, 11, 100 + step), b(4, 8, 11, 200 + step);
    const std::vector<nn::MicroBatch> micro{a.mb, b.mb};
    const StepStats want = cpu.TrainStep(micro);
    const StepStats got = gpu.TrainStep(micro);
    ASSERT_EQ(got.skipped, want.skipped) << "step " << step << ": loss scaling skipped on one";
    check.Step(want.step, got.loss, want.loss, got.grad_norm, want.grad_norm, lr_sum);
    lr_sum += want.lr;
  }
  ForEachWeightPair(gpu, cpu, [&](const std::string& name, const std::vector<float>& g,
                                  const std::vector<float>& w) {
    check.Values(name, g.data(), w.data(), static_cast<int64_t>(w.size()), lr_sum);
  });
  testing::OwnedBatch eval(4, 8, 11, 99);
  check.Eval(gpu.EvalLoss(eval.mb), cpu.EvalLoss(eval.mb), lr_sum);
  testing::ExpectWithinRounding(check, c.name);
}

INSTANTIATE_TEST_SUITE_P(
    Precisions, CudaMixedPrecisionTest,
    ::testing::Values(MixedCase{"bf16_stage0", "bf16", Layout{0}},
                      MixedCase{"bf16_stage3", "bf16", Layout{3}},
                      MixedCase{"bf16_stage2_opt_cpu", "bf16", Layout{2, "cpu"}},
                      MixedCase{"bf16_stage3_param_cpu", "bf16", Layout{3, "cpu", "cpu"}},
                      MixedCase{"fp16_stage0", "fp16", Layout{0}},
                      MixedCase{"fp16_stage2", "fp16", Layout{2}}),
    [](const ::testing::TestParamInfo<MixedCase>& info) { return std::string(info.param.name); });

// Note [Offloaded shards beside compute] (engine.cc): with offload_param cpu the stage-3
// gathers bring each shard from the host beside the ops (under bf16 its bf16 copy, refreshed
// after every update; with LoRA the frozen base's shard too) and the layer's ops wait for it
// on the device. Against the same run with the shards on the GPU (both stepping AdamW on the
// host, offload_optimizer cpu) that moves the same values, so every loss, norm and weight is
// the same bits: a layer that computed before its copy landed, or a stale bf16 copy, would
// show.
struct OffloadCase {
  const char* name;
  const char* precision;
  bool lora;
};
void PrintTo(const OffloadCase& c, std::ostream* os) { *os << c.name; }

class CudaOffloadedShardsTest : public CudaEngineTest,
                                public ::testing::WithParamInterface<OffloadCase> {};

TEST_P(CudaOffloadedShardsTest, TrainBitwiseAsShardsOnTheGpu) {
  const OffloadCase& c = GetParam();
  const nlohmann::json lora = {
      {"lora", {{"r", 4}, {"lora_alpha", 8}, {"target_modules", "all-linear"}}}};
  auto make = [&](const Layout& layout) {
    const Config config = MakeConfig("cuda:0", layout, nvme_dir_, c.precision,
                                     c.lora ? lora : nlohmann::json::object());
    return Engine(config,
                  nn::BuildModel(config.model, nn::MakeWholeLinears(), nn::AdapterPlan(config)));
  };
  Engine in_gpu = make(Layout{3, "cpu"});
  Engine offloaded = make(Layout{3, "cpu", "cpu"});
  for (int step = 0; step < 6; ++step) {
    testing::OwnedBatch a(4, 8, 11, 500 + step), b(4, 8, 11, 600 + step);
    const std::vector<nn::MicroBatch> micro{a.mb, b.mb};
    const StepStats want = in_gpu.TrainStep(micro);
    const StepStats got = offloaded.TrainStep(micro);
    ASSERT_EQ(got.loss, want.loss) << c.name << " step " << step;
    ASSERT_EQ(got.grad_norm, want.grad_norm) << c.name << " step " << step;
  }
  ForEachWeightPair(offloaded, in_gpu, [](const std::string& name, const std::vector<float>& g,
                                          const std::vector<float>& w) {
    ASSERT_EQ(g, w) << name;
  });
  testing::OwnedBatch eval(4, 8, 11, 98);
  EXPECT_EQ(offloaded.EvalLoss(eval.mb), in_gpu.EvalLoss(eval.mb));
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaOffloadedShardsTest,
                         ::testing::Values(OffloadCase{"fp32", "fp32", false},
                                           OffloadCase{"bf16", "bf16", false},
                                           OffloadCase{"bf16_lora", "bf16", true}),
                         [](const ::testing::TestParamInfo<OffloadCase>& info) {
                           return std::string(info.param.name);
                         });

// QLoRA on the GPU: a Llama whose frozen base is NF4 (double quantization) or INT8 blobs,
// dequantized before each GEMM (Ops::Dequantize, then the LoRA linears), trained on CUDA
// against the same run on the CPU, in bf16 and fp32, at ZeRO 0 and 3.
struct QloraCase {
  const char* name;
  const char* precision;
  int stage;
  nlohmann::json quantization;
};
void PrintTo(const QloraCase& c, std::ostream* os) { *os << c.name; }

class CudaQloraTest : public CudaEngineTest, public ::testing::WithParamInterface<QloraCase> {};

TEST_P(CudaQloraTest, TenStepsMatchTheCpu) {
  const QloraCase& c = GetParam();
  auto config = [&](const std::string& device) {
    nlohmann::json j = testing::TinyLlamaConfigJson(2, 11, 8);
    j["model"]["n_embd"] = 64;
    j["model"]["intermediate_size"] = 128;
    j["model"]["head_dim"] = 16;
    j["device"] = device;
    j["train_micro_batch_size_per_gpu"] = 4;
    j["gradient_accumulation_steps"] = 2;
    j.erase("train_batch_size");
    j["zero_optimization"] = {{"stage", c.stage}};
    if (std::string(c.precision) != "fp32") j[c.precision] = {{"enabled", true}};
    j["lora"] = {{"r", 4}, {"lora_alpha", 8}, {"target_modules", "all-linear"}};
    j["quantization"] = c.quantization;
    return ParseConfig(j);
  };
  const Config cpu_config = config("cpu"), gpu_config = config("cuda:0");
  auto make = [](const Config& cfg) {
    return Engine(cfg, nn::BuildModel(cfg.model, nn::MakeWholeLinears(), nn::AdapterPlan(cfg)));
  };
  Engine cpu = make(cpu_config);
  Engine gpu = make(gpu_config);
  constexpr int kSteps = 10;
  testing::EquivalenceCheck check = testing::CheckFor(cpu, 4, 2, kSteps);
  double lr_sum = 0.0;
  for (int step = 0; step < kSteps; ++step) {
    testing::OwnedBatch a(4, 8, 11, 300 + step), b(4, 8, 11, 400 + step);
    const std::vector<nn::MicroBatch> micro{a.mb, b.mb};
    const StepStats want = cpu.TrainStep(micro);
    const StepStats got = gpu.TrainStep(micro);
    check.Step(want.step, got.loss, want.loss, got.grad_norm, want.grad_norm, lr_sum);
    lr_sum += want.lr;
  }
  // Every parameter's whole fp32 value: the frozen base dequantized (the same on both), the
  // adapters trained.
  ForEachWeightPair(gpu, cpu, [&](const std::string& name, const std::vector<float>& g,
                                  const std::vector<float>& w) {
    check.Values(name, g.data(), w.data(), static_cast<int64_t>(w.size()), lr_sum);
  });
  testing::ExpectWithinRounding(check, c.name);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, CudaQloraTest,
    ::testing::Values(
        QloraCase{"nf4_double_quant_bf16_stage0", "bf16", 0,
                  {{"load_in_4bit", true},
                   {"bnb_4bit_quant_type", "nf4"},
                   {"bnb_4bit_use_double_quant", true}}},
        QloraCase{"nf4_bf16_stage3", "bf16", 3,
                  {{"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"}}},
        QloraCase{"int8_fp32_stage0", "fp32", 0, {{"load_in_8bit", true}}}),
    [](const ::testing::TestParamInfo<QloraCase>& info) { return std::string(info.param.name); });

TEST(CudaEngineNoGpuTest, AMissingGpuIsNamed) {
  if (kernels::CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible";
  const Config config = MakeConfig("cuda:0", Layout{}, "");
  try {
    Engine e(config, nn::BuildGpt2(config.model));
    FAIL() << "an engine on cuda:0 was built without a GPU";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUDA"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ztrain
