// Note [A run's config] (run/run_config.h): the model's shape from model.init_from, the
// "auto"s that depend on the machine (bf16 by the hardware, the micro-batch by the estimate),
// a Hugging Face Trainer config, and every problem named.
#include "run/run_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <string>

#include "core/error.h"
#include "estimate/estimate.h"
#include "estimate/tune.h"
#include "kernels/cpu/bf16_speed.h"
#include "kernels/ops.h"
#include "nn/gpt2.h"
#include "nn/llmc_model_file.h"
#include "tests/data/data_test_util.h"
#include "tests/engine/test_model.h"
#include "tests/expect_error.h"

namespace ztrain {
namespace {

using nlohmann::json;
using testing::ExpectErrorWith;

const LaunchEnv kAlone;  // one process outside any launcher

std::map<std::string, AutoChoice> Chosen(const Config& c) {
  std::map<std::string, AutoChoice> m;
  for (const AutoChoice& a : c.auto_choices) m[a.path] = a;
  return m;
}

// An llm.c model file of a small GPT-2 (2 blocks, 4 heads, 64 wide, vocabulary 300 padded to
// 384, context 48), random weights.
std::string WriteModel(const data::test_util::TempDir& dir) {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_embd = 64;
  m.vocab_size = 300;
  m.padded_vocab_size = 384;
  m.max_seq_len = 48;
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, Shape> shapes;
  for (const auto& layer : nn::BuildGpt2(m)) {
    for (const nn::ParamSpec& s : layer->Params()) {
      shapes[s.name] = s.shape;
      values[s.name].assign(static_cast<size_t>(NumElements(s.shape)), 0.01f);
    }
  }
  const std::string path = dir.File("model.bin");
  nn::SaveLlmcModel(path, m, [&](const std::string& name) {
    return Tensor(values.at(name).data(), DType::kF32, shapes.at(name));
  });
  return path;
}

TEST(RunConfigTest, InitFromAloneSetsTheModelsShape) {
  data::test_util::TempDir dir;
  const std::string model = WriteModel(dir);
  // Nothing but the file: the schema's defaults (GPT-2 124M, context 1024) would not load it.
  const Config c = ResolveRunConfig(
      {{"train_micro_batch_size_per_gpu", 2}, {"model", {{"init_from", model}}}}, 1, kAlone);
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.n_embd, 64);
  EXPECT_EQ(c.model.vocab_size, 300);
  EXPECT_EQ(c.model.padded_vocab_size, 384);
  EXPECT_EQ(c.model.max_seq_len, 48);
  EXPECT_EQ(c.data.seq_len, 48);  // "auto" follows the file's context
  const AutoChoice shape = Chosen(c).at("model");
  EXPECT_EQ(shape.value["n_embd"], 64);
  EXPECT_NE(shape.reason.find(model), std::string::npos) << shape.reason;
  // Keys that agree with the file are fine; one that disagrees names both values, and every
  // such key is named at once.
  json agree = {{"train_micro_batch_size_per_gpu", 2},
                {"model", {{"init_from", model}, {"n_embd", 64}, {"n_layer", 2}}}};
  EXPECT_EQ(ResolveRunConfig(agree, 1, kAlone).model.max_seq_len, 48);
  json disagree = agree;
  disagree["model"]["max_seq_len"] = 1024;
  disagree["model"]["n_head"] = 8;
  ExpectErrorWith<ConfigError>(
      [&] { ResolveRunConfig(disagree, 1, kAlone); },
      {"invalid config (2 problems)", "model.n_head: the config says 8 but model.init_from",
       "has 4", "model.max_seq_len: the config says 1024", "has 48",
       "remove model.max_seq_len (the file sets the shape)"});
  json missing = agree;
  missing["model"]["init_from"] = dir.File("none.bin");
  ExpectErrorWith<ConfigError>([&] { ResolveRunConfig(missing, 1, kAlone); },
                               {"model.init_from:", "none.bin", "No such file"});
}

// Note [bf16 where it pays]: on the CPU "auto" takes bf16 only where it measures faster than
// fp32 on the model's GEMM, and says so with the figures.
TEST(RunConfigTest, Bf16AutoFollowsTheMeasurement) {
  json j = testing::TinyConfigJson();
  j["device"] = "cpu";
  j["bf16"] = {{"enabled", "auto"}};
  const Config c = ResolveRunConfig(j, 1, kAlone);
  std::string why;
  const AutoChoice bf16 = Chosen(c).at("bf16.enabled");
  EXPECT_EQ(bf16.value, c.precision.bf16);
  if (!kernels::CpuHasBf16(&why)) {
    EXPECT_FALSE(c.precision.bf16);
    EXPECT_NE(bf16.reason.find(why), std::string::npos) << bf16.reason;
  } else {
    EXPECT_NE(bf16.reason.find("measured on the model's MLP GEMM (1024x512x512): bf16 "),
              std::string::npos)
        << bf16.reason;
    EXPECT_NE(bf16.reason.find(c.precision.bf16 ? "so bf16 pays" : "not enough to pay"),
              std::string::npos)
        << bf16.reason;
  }
  j["fp16"] = {{"enabled", true}};  // fp16 chosen: bf16 "auto" stays off
  const Config f = ResolveRunConfig(j, 1, kAlone);
  EXPECT_FALSE(f.precision.bf16);
  EXPECT_TRUE(f.precision.fp16);
  EXPECT_EQ(Chosen(f).at("bf16.enabled").reason, "fp16.enabled is true");
}

// The micro-batch "auto" is the largest that fits 90 % of the rank's share of the node's memory
// by the estimate (capped by what one batch of the data allows), and it is logged so.
TEST(RunConfigTest, MicroBatchAutoIsTheLargestThatFits) {
  // The schema's model (GPT-2 124M, T = 1024), whose activations bind well within 4096.
  json j = {{"train_micro_batch_size_per_gpu", "auto"}, {"device", "cpu"}};
  const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  for (int local : {1, 4}) {
    LaunchEnv env;
    env.local_size = local;
    const Config c = ResolveRunConfig(j, 1, env);
    const int64_t b = c.train_micro_batch_size_per_gpu;
    const double budget = 0.9 * static_cast<double>(physical / local);
    ASSERT_GE(b, 1);
    EXPECT_LE(EstimateMemory(WithMicroBatch(c, b)).device_total_peak, budget);
    const AutoChoice chosen = Chosen(c).at("train_micro_batch_size_per_gpu");
    EXPECT_EQ(chosen.value, b);
    if (chosen.reason.find("one batch of the data allows") == std::string::npos && b < 4096) {
      EXPECT_GT(EstimateMemory(WithMicroBatch(c, b + 1)).device_total_peak, budget);
    }
    EXPECT_NE(chosen.reason.find("as ztrain tune finds it"), std::string::npos) << chosen.reason;
    EXPECT_EQ(c.train_batch_size, b);
  }
  // A train_batch_size given derives the micro-batch by DeepSpeed's rules instead.
  j["train_batch_size"] = 12;
  j["gradient_accumulation_steps"] = 3;
  EXPECT_EQ(ResolveRunConfig(j, 2, kAlone).train_micro_batch_size_per_gpu, 2);
}

// A Hugging Face Trainer ZeRO-3 config, "auto" wherever the HF docs put it, is accepted.
TEST(RunConfigTest, AHuggingFaceTrainerConfigResolvesEveryAuto) {
  const json hf = json::parse(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW",
                  "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR",
                  "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                             "warmup_num_steps": "auto"}},
    "zero_optimization": {
      "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
      "offload_param": {"device": "cpu", "pin_memory": true}, "overlap_comm": true,
      "contiguous_gradients": true, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
      "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
      "stage3_gather_16bit_weights_on_model_save": true},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false,
    "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 512, "max_seq_len": 64},
    "device": "cpu"
  })");
  const Config c = ResolveRunConfig(hf, 2, kAlone);
  const std::map<std::string, AutoChoice> chosen = Chosen(c);
  for (const char* key :
       {"bf16.enabled", "train_micro_batch_size_per_gpu", "train_batch_size",
        "gradient_accumulation_steps", "gradient_clipping", "optimizer.params.lr",
        "optimizer.params.betas", "optimizer.params.eps", "optimizer.params.weight_decay",
        "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr",
        "scheduler.params.warmup_num_steps", "fp16.enabled", "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size",
        "zero_optimization.stage3_param_persistence_threshold"}) {
    EXPECT_EQ(chosen.count(key), 1u) << key;
  }
  EXPECT_EQ(chosen.size(), 16u);
  EXPECT_EQ(c.zero.reduce_bucket_size, 64 * 64);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, static_cast<int64_t>(0.9 * 64 * 64));
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 640);
  EXPECT_EQ(c.train_batch_size, 2 * c.train_micro_batch_size_per_gpu);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 5e-5);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 5e-5);
}

}  // namespace
}  // namespace ztrain

namespace ztrain {
namespace {

// check-config and train resolve a config through ResolveRunConfig: what the model's family
// refuses (a shape it cannot build, a split over tp it cannot make) is refused there, before
// anything is built, with every reason.
TEST(RunConfigTest, TheFamilysRefusalsComeBeforeTheRun) {
  nlohmann::json j = testing::TinyLlamaConfigJson();
  j["model"]["n_kv_head"] = 3;
  testing::ExpectErrorWith<ConfigError>(
      [&] { ResolveRunConfig(j, 1, LaunchEnv()); },
      {"model: model.n_kv_head 3 must divide model.n_head 4"});
  j = testing::TinyLlamaConfigJson();
  j["tensor_parallel"] = {{"size", 4}};
  testing::ExpectErrorWith<ConfigError>(
      [&] { ResolveRunConfig(j, 4, LaunchEnv()); },
      {"model.n_kv_head 2 does not divide by tensor_parallel.size 4", "(1, 2)"});
  j = testing::TinyConfigJson();  // GPT-2 takes no Llama knob, not even a harmless one
  EXPECT_NO_THROW(ResolveRunConfig(j, 1, LaunchEnv()));
  j["model"]["rope_theta"] = 500000.0;
  j["model"]["head_dim"] = 3;
  testing::ExpectErrorWith<ConfigError>(
      [&] { ResolveRunConfig(j, 1, LaunchEnv()); },
      {"model.head_dim 3", "model.rope_theta (GPT-2 has learned positions)",
       "model.type \"llama\""});
}

}  // namespace
}  // namespace ztrain

namespace ztrain {
namespace {

TEST(RunConfigTest, Bf16PaysOnlyWhenMeasuredFaster) {
  kernels::Bf16Speed speed;
  speed.available = true;
  speed.m = 1024, speed.k = 768, speed.n = 3072;
  speed.fp32_gflops = 230.0;
  speed.bf16_gflops = 137.5;  // the Intel Xeon of issue 34: oneDNN 2.6 below SGEMM
  std::string why;
  EXPECT_FALSE(kernels::Bf16Pays(speed, &why));
  EXPECT_NE(why.find("bf16 138 GFLOP/s against fp32's 230 on OpenBLAS (60 %), not enough to "
                     "pay (bf16 needs 110 %)"),
            std::string::npos)
      << why;
  speed.bf16_gflops = 415.0;  // the AMD EPYC: 2.1x
  EXPECT_TRUE(kernels::Bf16Pays(speed, &why));
  EXPECT_NE(why.find("bf16 415 GFLOP/s against fp32's 230 on OpenBLAS (180 %), so bf16 pays"),
            std::string::npos)
      << why;
  speed.fp32_gflops = 400.0;  // fp32 on the backend an fp32 run would use: oneDNN, faster here
  speed.fp32_backend = "oneDNN";
  EXPECT_FALSE(kernels::Bf16Pays(speed, &why));
  EXPECT_NE(why.find("against fp32's 400 on oneDNN (104 %), not enough"), std::string::npos) << why;
  speed.fp32_gflops = 230.0;
  speed.bf16_gflops = 240.0;  // within the margin: fp32 keeps its precision
  EXPECT_FALSE(kernels::Bf16Pays(speed, &why));
  speed.available = false;
  speed.detail = "no AVX512-BF16";
  EXPECT_FALSE(kernels::Bf16Pays(speed, &why));
  EXPECT_EQ(why, "no AVX512-BF16");
}

// Note [bf16 where it pays] with the memory the run needs: slower bf16 is taken only where the
// fp32 run does not fit and the bf16 run does.
TEST(RunConfigTest, Bf16IsTakenWhereOnlyItFits) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  const std::string slow = "bf16 138 GFLOP/s against fp32's 230 on OpenBLAS";
  Bf16Memory m{20 * kGiB, 12 * kGiB, 16 * kGiB, "17.78 GiB, this rank's share"};
  std::string why;
  EXPECT_TRUE(Bf16ForTheRun(false, slow, m, &why));
  EXPECT_NE(why.find("only bf16 fits: the fp32 run needs 20.00 GiB by the estimate, more than "
                     "16.00 GiB (90 % of 17.78 GiB, this rank's share), the bf16 run 12.00 GiB "
                     "(bf16 does not pay for speed here: " +
                     slow + ", but it runs)"),
            std::string::npos)
      << why;
  EXPECT_TRUE(Bf16ForTheRun(true, "so bf16 pays", m, &why));  // fast: memory need not decide
  EXPECT_EQ(why, "so bf16 pays");
  m.fp32_peak = 15 * kGiB;  // fp32 fits: it keeps its precision
  EXPECT_FALSE(Bf16ForTheRun(false, slow, m, &why));
  EXPECT_EQ(why, slow);
  m.fp32_peak = 40 * kGiB, m.bf16_peak = 24 * kGiB;  // neither fits: fp32, and say so
  EXPECT_FALSE(Bf16ForTheRun(false, slow, m, &why));
  EXPECT_NE(why.find("; in bf16 it would not fit either (24.00 GiB"), std::string::npos) << why;
  EXPECT_FALSE(Bf16ForTheRun(false, slow, Bf16Memory{}, &why));  // not estimated
  EXPECT_EQ(why, slow);
}

// The same through a whole config on this machine: a micro-batch whose fp32 estimate exceeds
// 90 % of this machine's memory and whose bf16 estimate does not resolves bf16 "auto" to true,
// whatever bf16's speed here.
TEST(RunConfigTest, Bf16AutoTakesBf16WhereOnlyItFits) {
  json j = testing::SmallConfigJson(1, 1);
  j["device"] = "cpu";
  j["bf16"] = {{"enabled", "auto"}};
  const int64_t budget =
      static_cast<int64_t>(0.9 * static_cast<double>(static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) *
                                                     sysconf(_SC_PAGESIZE)));
  const auto peak = [&](int64_t micro, bool bf16) {
    json p = j;
    p["train_micro_batch_size_per_gpu"] = micro;
    p.erase("train_batch_size");
    p["bf16"]["enabled"] = bf16;
    return EstimateMemory(ParseConfig(p)).device_total_peak;
  };
  int64_t micro = 1;
  while (peak(micro, false) <= budget) micro *= 2;
  for (int64_t step = micro / 4; step >= 1; step /= 2) {  // the smallest that does not fit
    if (peak(micro - step, false) > budget) micro -= step;
  }
  ASSERT_GT(peak(micro, false), budget);
  ASSERT_LE(peak(micro, true), budget) << "bf16's activations are half of fp32's";
  j["train_micro_batch_size_per_gpu"] = micro;
  j.erase("train_batch_size");
  const Config c = ResolveRunConfig(j, 1, kAlone);
  EXPECT_TRUE(c.precision.bf16) << Chosen(c).at("bf16.enabled").reason;
  const std::string reason = Chosen(c).at("bf16.enabled").reason;
  if (reason.find("so bf16 pays") == std::string::npos) {  // bf16 is slow here: memory decided
    EXPECT_NE(reason.find("only bf16 fits"), std::string::npos) << reason;
  }
}

// A 0 written for a size "auto" derives (n_kv_head, head_dim, intermediate_size) is no
// model's size: refused, where it was taken as "auto" before. The resolved config (and so
// every checkpoint's) still says "auto" with 0, and ParseConfig reads it back so.
TEST(RunConfigTest, ZeroForADerivedSizeIsRefused) {
  for (const char* key : {"n_kv_head", "head_dim", "intermediate_size"}) {
    nlohmann::json zero = testing::TinyLlamaConfigJson();
    zero["model"][key] = 0;
    testing::ExpectErrorWith<ConfigError>([&] { ResolveRunConfig(zero, 1, LaunchEnv()); },
                                          {std::string("model.") + key +
                                           ": must be >= 1, got 0 (\"auto\""});
  }
  nlohmann::json j = testing::TinyLlamaConfigJson();
  j["model"].erase("n_kv_head");
  const Config c = ResolveRunConfig(j, 1, LaunchEnv());
  const int heads = c.resolved["model"]["n_head"];
  EXPECT_EQ(c.resolved["model"]["n_kv_head"], 0);
  EXPECT_EQ(c.model.kv_heads(), heads);
  EXPECT_EQ(ParseConfig(c.resolved).model.kv_heads(), heads);
}

}  // namespace
}  // namespace ztrain
