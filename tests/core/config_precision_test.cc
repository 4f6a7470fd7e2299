// Config: mixed precision (bf16, fp16, data_types.grad_accum_dtype) and activation
// checkpointing — defaults, every key, every error, the resolved JSON, DeepSpeed configs.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/dtype.h"
#include "config_test_util.h"

namespace ztrain {
namespace {

using nlohmann::json;

// The built-in default (model.n_layer = 4) with `patch` merged in (RFC 7386).
json Patched(const json& patch) {
  json j = DefaultConfigJson();
  j.merge_patch(patch);
  return j;
}
Config Parse(const char* patch) { return ParseConfig(Patched(json::parse(patch))); }
std::string ErrorOf(const char* patch) {
  return testing::ConfigErrorOf(Patched(json::parse(patch)));
}
// True when the only problem reported is `message`.
::testing::AssertionResult OnlyProblem(const std::string& error, const std::string& message) {
  if (error.find("invalid config (1 problem):\n  " + message) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "expected only \"" << message << "\", got:\n" << error;
}
// The resolved config parses to itself again (it is what checkpoints store and
// `ztrain check-config` prints).
void ExpectRoundTrip(const Config& c) {
  EXPECT_EQ(ParseConfig(c.resolved).resolved, c.resolved) << c.resolved.dump(2);
}

// --- precision -------------------------------------------------------------------------------

TEST(ConfigPrecisionTest, DefaultsAreDeepSpeedsAndFp32) {
  const Config c = ParseConfig(DefaultConfigJson());
  const PrecisionConfig& p = c.precision;
  EXPECT_FALSE(p.bf16);
  EXPECT_FALSE(p.fp16);
  EXPECT_EQ(p.loss_scale, 0.0);
  EXPECT_EQ(p.initial_scale_power, 16);
  EXPECT_EQ(p.loss_scale_window, 1000);
  EXPECT_EQ(p.hysteresis, 2);
  EXPECT_FALSE(p.consecutive_hysteresis);
  EXPECT_EQ(p.min_loss_scale, 1.0);
  EXPECT_EQ(p.max_consecutive_skips, 50);
  EXPECT_EQ(p.grad_accum_dtype, "fp32");
  EXPECT_EQ(ComputeDType(c), DType::kF32);
  EXPECT_EQ(GradAccumDType(c), DType::kF32);
  const json& fp16 = c.resolved["fp16"];
  EXPECT_EQ(fp16, json::parse(R"({"enabled": false, "auto_cast": false, "loss_scale": 0,
      "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
      "consecutive_hysteresis": false, "min_loss_scale": 1, "max_consecutive_skips": 50,
      "fp16_master_weights_and_grads": false})"));
  EXPECT_EQ(c.resolved["bf16"]["enabled"], false);
  EXPECT_EQ(c.resolved["data_types"]["grad_accum_dtype"], "fp32");  // null resolved
}

TEST(ConfigPrecisionTest, EveryFp16KeyIsParsed) {
  const Config c = Parse(R"({"fp16": {"enabled": true, "auto_cast": false, "loss_scale": 128.5,
      "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 3,
      "consecutive_hysteresis": true, "min_loss_scale": 0.25, "max_consecutive_skips": 0}})");
  const PrecisionConfig& p = c.precision;
  EXPECT_TRUE(p.fp16);
  EXPECT_FALSE(p.bf16);
  EXPECT_EQ(p.loss_scale, 128.5);
  EXPECT_EQ(p.initial_scale_power, 12);
  EXPECT_EQ(p.loss_scale_window, 500);
  EXPECT_EQ(p.hysteresis, 3);
  EXPECT_TRUE(p.consecutive_hysteresis);
  EXPECT_EQ(p.min_loss_scale, 0.25);
  EXPECT_EQ(p.max_consecutive_skips, 0);  // no limit
  EXPECT_EQ(p.grad_accum_dtype, "fp16");  // null with fp16: fp16, as DeepSpeed
  EXPECT_EQ(ComputeDType(c), DType::kF16);
  EXPECT_EQ(GradAccumDType(c), DType::kF16);
  EXPECT_EQ(c.resolved["fp16"]["loss_scale"], 128.5);
  EXPECT_EQ(c.resolved["fp16"]["max_consecutive_skips"], 0);
  EXPECT_EQ(c.resolved["data_types"]["grad_accum_dtype"], "fp16");
  ExpectRoundTrip(c);
}

TEST(ConfigPrecisionTest, Bf16AccumulatesInFp32UnlessAskedForBf16) {
  Config c = Parse(R"({"bf16": {"enabled": true}})");
  EXPECT_TRUE(c.precision.bf16);
  EXPECT_FALSE(c.precision.fp16);
  EXPECT_EQ(ComputeDType(c), DType::kBF16);
  EXPECT_EQ(GradAccumDType(c), DType::kF32);
  EXPECT_EQ(c.resolved["data_types"]["grad_accum_dtype"], "fp32");
  ExpectRoundTrip(c);
  c = Parse(R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"}})");
  EXPECT_EQ(GradAccumDType(c), DType::kBF16);
  c = Parse(R"({"fp16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}})");
  EXPECT_EQ(ComputeDType(c), DType::kF16);
  EXPECT_EQ(GradAccumDType(c), DType::kF32);
}

TEST(ConfigPrecisionTest, OlderSectionNameBfloat16IsRead) {
  json j = DefaultConfigJson();
  j["bfloat16"] = {{"enabled", true}};
  const Config c = ParseConfig(j);
  EXPECT_TRUE(c.precision.bf16);
  EXPECT_FALSE(c.resolved.contains("bfloat16"));
  EXPECT_EQ(c.resolved["bf16"]["enabled"], true);
  j["bfloat16"] = {{"enabled", true}, {"immediate_grad_updat", true}};  // checked as bf16
  EXPECT_NE(
      testing::ConfigErrorOf(j).find(
          "bf16.immediate_grad_updat: unknown key; did you mean \"bf16.immediate_grad_update\""),
      std::string::npos);
  j["bfloat16"] = {{"enabled", false}};
  j["bf16"] = {{"enabled", true}};
  EXPECT_TRUE(OnlyProblem(testing::ConfigErrorOf(j),
                          "bfloat16: \"bf16\" and its older name \"bfloat16\" are both given; "
                          "keep only \"bf16\""));
}

TEST(ConfigPrecisionTest, AutoIsOff) {
  const Config c = Parse(R"({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}})");
  EXPECT_EQ(ComputeDType(c), DType::kF32);
}

TEST(ConfigPrecisionTest, BothEnabledNamesBothKeys) {
  EXPECT_TRUE(OnlyProblem(ErrorOf(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"),
                          "fp16.enabled: true together with bf16.enabled true; choose one"));
}

TEST(ConfigPrecisionTest, AutoCastIsRefused) {
  EXPECT_TRUE(OnlyProblem(ErrorOf(R"({"fp16": {"enabled": true, "auto_cast": true}})"),
                          "fp16.auto_cast: ztrain does not autocast: with fp16.enabled every op "
                          "computes in fp16 from fp32 master weights; set auto_cast to false"));
}

TEST(ConfigPrecisionTest, Fp16RangesAreDeepSpeedsWhetherOrNotEnabled) {
  struct Case {
    const char* patch;
    const char* message;
  };
  const Case cases[] = {
      {R"({"fp16": {"loss_scale": -1}})",
       "fp16.loss_scale: must be >= 0 (0 = dynamic loss scaling), got -1"},
      {R"({"fp16": {"initial_scale_power": -1}})",
       "fp16.initial_scale_power: must be in [0, 1023] (the dynamic scale starts at 2^power; "
       "DeepSpeed's default is 16), got -1"},
      {R"({"fp16": {"initial_scale_power": 1024}})", "fp16.initial_scale_power: must be in [0, "},
      {R"({"fp16": {"loss_scale_window": 0}})", "fp16.loss_scale_window: must be >= 1, got 0"},
      {R"({"fp16": {"hysteresis": 0}})", "fp16.hysteresis: must be >= 1, got 0"},
      {R"({"fp16": {"hysteresis": 3000000000}})", "fp16.hysteresis: must be <= 2147483647"},
      {R"({"fp16": {"min_loss_scale": 0}})",
       "fp16.min_loss_scale: must be > 0 (DeepSpeed's default is 1), got 0"},
      {R"({"fp16": {"max_consecutive_skips": -1}})",
       "fp16.max_consecutive_skips: must be >= 0, got -1"},
      {R"({"fp16": {"loss_scale_window": "long"}})",
       "fp16.loss_scale_window: expected integer, got string \"long\""},
  };
  for (const Case& k : cases) {
    EXPECT_TRUE(OnlyProblem(ErrorOf(k.patch), k.message)) << k.patch;
    json enabled = json::parse(k.patch);
    enabled["fp16"]["enabled"] = true;
    EXPECT_TRUE(OnlyProblem(testing::ConfigErrorOf(Patched(enabled)), k.message)) << k.patch;
  }
  // The bounds themselves are fine.
  const Config c = Parse(R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 0,
      "loss_scale_window": 1, "hysteresis": 1, "min_loss_scale": 1e-30}})");
  EXPECT_EQ(c.precision.initial_scale_power, 0);
  EXPECT_EQ(Parse(R"({"fp16": {"initial_scale_power": 1023}})").precision.initial_scale_power,
            1023);
}

TEST(ConfigPrecisionTest, GradAccumDTypeTakesDeepSpeedsSpellings) {
  struct Case {
    const char* training;  // section enabled, or "" for fp32
    const char* spelling;
    const char* resolved;
  };
  const Case cases[] = {
      {"", "fp32", "fp32"},
      {"", "float32", "fp32"},
      {"", "float", "fp32"},
      {"", "torch.float32", "fp32"},
      {"", "FP32", "fp32"},
      {"fp16", "fp16", "fp16"},
      {"fp16", "float16", "fp16"},
      {"fp16", "half", "fp16"},
      {"fp16", "torch.float16", "fp16"},
      {"bf16", "bf16", "bf16"},
      {"bf16", "bfloat16", "bf16"},
      {"bf16", "torch.bfloat16", "bf16"},
      {"bf16", "float", "fp32"},
  };
  for (const Case& k : cases) {
    json patch = {{"data_types", {{"grad_accum_dtype", k.spelling}}}};
    if (*k.training) patch[k.training] = {{"enabled", true}};
    const Config c = ParseConfig(Patched(patch));
    EXPECT_EQ(c.precision.grad_accum_dtype, k.resolved) << k.spelling;
    EXPECT_EQ(c.resolved["data_types"]["grad_accum_dtype"], k.resolved) << k.spelling;
    EXPECT_EQ(DTypeName(GradAccumDType(c)), k.resolved) << k.spelling;
  }
  EXPECT_NE(ErrorOf(R"({"data_types": {"grad_accum_dtype": "int8"}})")
                .find("data_types.grad_accum_dtype: expected one of \"fp32\", \"fp16\", \"bf16\""),
            std::string::npos);
}

TEST(ConfigPrecisionTest, SixteenBitGradientsNeedTheSameTrainingDType) {
  EXPECT_TRUE(OnlyProblem(
      ErrorOf(R"({"data_types": {"grad_accum_dtype": "bf16"}})"),
      "data_types.grad_accum_dtype: \"bf16\" gradients need bf16 training, but this config "
      "trains in fp32; set bf16.enabled to true, or grad_accum_dtype to \"fp32\" or null"));
  EXPECT_TRUE(OnlyProblem(ErrorOf(R"({"data_types": {"grad_accum_dtype": "half"}})"),
                          "data_types.grad_accum_dtype: \"fp16\" gradients need fp16 training"));
  EXPECT_TRUE(OnlyProblem(
      ErrorOf(R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp16"}})"),
      "data_types.grad_accum_dtype: \"fp16\" gradients do not go with bf16 training "
      "(bf16.enabled); use \"bf16\" or \"fp32\", or null (fp32)"));
  EXPECT_TRUE(OnlyProblem(
      ErrorOf(R"({"fp16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"}})"),
      "data_types.grad_accum_dtype: \"bf16\" gradients do not go with fp16 training "
      "(fp16.enabled); use \"fp16\" or \"fp32\", or null (fp16)"));
}

// --- activation checkpointing ----------------------------------------------------------------

std::vector<int> Blocks(std::initializer_list<int> b) { return b; }

TEST(ConfigActivationCheckpointingTest, OffByDefault) {
  const Config c = ParseConfig(DefaultConfigJson());
  const ActivationCheckpointingConfig& a = c.activation_checkpointing;
  EXPECT_FALSE(a.enabled);
  EXPECT_FALSE(a.partition_activations);
  EXPECT_FALSE(a.cpu_checkpointing);
  EXPECT_EQ(a.number_checkpoints, 0);
  EXPECT_TRUE(a.blocks.empty());
  EXPECT_EQ(c.resolved["activation_checkpointing"], json::parse(R"({"enabled": false,
      "blocks": null, "partition_activations": false, "cpu_checkpointing": false,
      "contiguous_memory_optimization": false, "number_checkpoints": null,
      "synchronize_checkpoint_boundary": false, "profile": false})"));
}

TEST(ConfigActivationCheckpointingTest, EnabledCheckpointsEveryBlock) {
  const Config c = Parse(R"({"activation_checkpointing": {"enabled": true}})");
  EXPECT_TRUE(c.activation_checkpointing.enabled);
  EXPECT_EQ(c.activation_checkpointing.blocks, Blocks({0, 1, 2, 3}));  // model.n_layer = 4
  EXPECT_EQ(c.resolved["activation_checkpointing"]["blocks"], json({0, 1, 2, 3}));
  ExpectRoundTrip(c);
}

TEST(ConfigActivationCheckpointingTest, EveryKeyIsParsed) {
  const Config c = Parse(R"({"activation_checkpointing": {"enabled": true,
      "partition_activations": true, "cpu_checkpointing": true,
      "contiguous_memory_optimization": true, "number_checkpoints": 3,
      "synchronize_checkpoint_boundary": true, "profile": true}})");
  const ActivationCheckpointingConfig& a = c.activation_checkpointing;
  EXPECT_TRUE(a.enabled);
  EXPECT_TRUE(a.partition_activations);
  EXPECT_TRUE(a.cpu_checkpointing);
  EXPECT_EQ(a.number_checkpoints, 3);
  EXPECT_EQ(a.blocks, Blocks({0, 1, 2}));  // the first 3
  for (const char* key :
       {"contiguous_memory_optimization", "synchronize_checkpoint_boundary", "profile"}) {
    EXPECT_EQ(c.resolved["activation_checkpointing"][key], true) << key;  // accepted, no effect
  }
  ExpectRoundTrip(c);
}

TEST(ConfigActivationCheckpointingTest, BlocksAreSortedAndChooseTheBlocks) {
  const Config c = Parse(R"({"activation_checkpointing": {"blocks": [3, 1]}})");
  EXPECT_TRUE(c.activation_checkpointing.enabled);  // implied by blocks
  EXPECT_EQ(c.activation_checkpointing.blocks, Blocks({1, 3}));
  EXPECT_EQ(c.resolved["activation_checkpointing"]["blocks"], json({1, 3}));
  EXPECT_EQ(c.resolved["activation_checkpointing"]["enabled"], true);
  ExpectRoundTrip(c);
  // Both keys, agreeing: fine.
  const Config both =
      Parse(R"({"activation_checkpointing": {"blocks": [1, 0], "number_checkpoints": 2}})");
  EXPECT_EQ(both.activation_checkpointing.blocks, Blocks({0, 1}));
}

TEST(ConfigActivationCheckpointingTest, WhatImpliesEnabled) {
  struct Case {
    const char* section;
    bool enabled;
  };
  const Case cases[] = {
      {R"({})", false},
      {R"({"number_checkpoints": 2})", true},
      {R"({"blocks": [0]})", true},
      {R"({"partition_activations": true})", true},
      {R"({"cpu_checkpointing": true})", true},
      {R"({"partition_activations": false, "cpu_checkpointing": false})", false},
      {R"({"contiguous_memory_optimization": true, "profile": true})", false},
      {R"({"number_checkpoints": null})", false},
      {R"({"enabled": false, "number_checkpoints": 2, "blocks": [0, 1]})", false},
      {R"({"enabled": false, "cpu_checkpointing": true})", false},
  };
  for (const Case& k : cases) {
    json patch = {{"activation_checkpointing", json::parse(k.section)}};
    const Config c = ParseConfig(Patched(patch));
    EXPECT_EQ(c.activation_checkpointing.enabled, k.enabled) << k.section;
    EXPECT_EQ(c.resolved["activation_checkpointing"]["enabled"], k.enabled) << k.section;
    EXPECT_EQ(c.activation_checkpointing.blocks.empty(), !k.enabled) << k.section;
    ExpectRoundTrip(c);
  }
}

TEST(ConfigActivationCheckpointingTest, BadBlocksNameTheIndexAndNLayer) {
  const char* a = "activation_checkpointing.";
  struct Case {
    const char* section;
    std::string message;
  };
  const Case cases[] = {
      {R"({"blocks": [0, 4]})", std::string(a) +
                                    "blocks: block index 4 is out of range [0, model.n_layer = "
                                    "4); blocks count from 0"},
      {R"({"blocks": [-1]})", std::string(a) + "blocks: block index -1 is out of range [0, "},
      {R"({"blocks": [2, 1, 2]})", std::string(a) + "blocks: block index 2 is listed twice"},
      {R"({"blocks": []})", std::string(a) + "blocks: lists no block; give the indices"},
      {R"({"blocks": [0.5]})",
       std::string(a) + "blocks: expected array of integers or null, got array [0.5]"},
      {R"({"blocks": 1})", std::string(a) + "blocks: expected array of integers or null"},
      {R"({"number_checkpoints": 0})",
       std::string(a) + "number_checkpoints: must be in [1, model.n_layer = 4] (checkpoint the "
                        "first N blocks) or null (every block), got 0"},
      {R"({"number_checkpoints": 5})", std::string(a) + "number_checkpoints: must be in [1, "},
      {R"({"number_checkpoints": 2, "blocks": [1, 2]})",
       std::string(a) + "blocks: [1,2] disagrees with number_checkpoints 2 (the first 2 "
                        "blocks); give only one of the two keys"},
      {R"({"enabled": false, "blocks": [7]})",  // checked even when off
       std::string(a) + "blocks: block index 7 is out of range"},
  };
  for (const Case& k : cases) {
    json patch = {{"activation_checkpointing", json::parse(k.section)}};
    EXPECT_TRUE(OnlyProblem(testing::ConfigErrorOf(Patched(patch)), k.message)) << k.section;
  }
  // Integral floats are integers, as everywhere (DeepSpeed writes 5e8).
  EXPECT_EQ(
      Parse(R"({"activation_checkpointing": {"blocks": [2.0]}})").activation_checkpointing.blocks,
      Blocks({2}));
}

TEST(ConfigActivationCheckpointingTest, BlocksFollowNLayer) {
  const Config c = Parse(R"({"model": {"n_layer": 6}, "activation_checkpointing":
      {"enabled": true, "blocks": [5]}})");
  EXPECT_EQ(c.activation_checkpointing.blocks, Blocks({5}));
  EXPECT_TRUE(OnlyProblem(
      ErrorOf(R"({"model": {"n_layer": 70000}, "activation_checkpointing": {"enabled": true}})"),
      "model.n_layer: must be <= 65536, got 70000"));
}

// --- DeepSpeed configs -----------------------------------------------------------------------

// As Hugging Face's and Megatron-DeepSpeed's bf16 ZeRO examples write it.
TEST(ConfigPrecisionDeepSpeedTest, Bf16ZeroConfigIsAccepted) {
  const Config c = ParseConfig(json::parse(R"({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true,
                          "reduce_bucket_size": 5e8},
    "activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": false,
                                 "contiguous_memory_optimization": false,
                                 "number_checkpoints": null,
                                 "synchronize_checkpoint_boundary": false, "profile": false},
    "gradient_clipping": 1.0
  })"),
                               /*world_size=*/2);
  EXPECT_EQ(ComputeDType(c), DType::kBF16);
  EXPECT_EQ(GradAccumDType(c), DType::kF32);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_FALSE(c.activation_checkpointing.enabled);
  EXPECT_EQ(c.train_batch_size, 16);
}

// DeepSpeed's documented fp16 section in full, with Megatron-style checkpointing.
TEST(ConfigPrecisionDeepSpeedTest, FullFp16ConfigIsAccepted) {
  const Config c = ParseConfig(json::parse(R"({
    "train_batch_size": 32, "train_micro_batch_size_per_gpu": 8,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "weight_decay": 0.01}},
    "fp16": {"enabled": true, "auto_cast": false, "loss_scale": 0, "initial_scale_power": 16,
             "loss_scale_window": 1000, "hysteresis": 2, "consecutive_hysteresis": false,
             "min_loss_scale": 1},
    "data_types": {"grad_accum_dtype": "fp16"},
    "zero_optimization": {"stage": 1},
    "activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": false,
                                 "contiguous_memory_optimization": true,
                                 "number_checkpoints": 4,
                                 "synchronize_checkpoint_boundary": true, "profile": false}
  })"),
                               /*world_size=*/4);
  EXPECT_EQ(ComputeDType(c), DType::kF16);
  EXPECT_EQ(GradAccumDType(c), DType::kF16);
  EXPECT_EQ(c.precision.initial_scale_power, 16);
  EXPECT_EQ(c.precision.max_consecutive_skips, 50);  // ztrain's default
  EXPECT_TRUE(c.activation_checkpointing.enabled);
  EXPECT_TRUE(c.activation_checkpointing.partition_activations);
  EXPECT_EQ(c.activation_checkpointing.blocks.size(), 4u);  // GPT-2 124M: the first 4 of 12
  EXPECT_EQ(c.activation_checkpointing.blocks.back(), 3);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
}

}  // namespace
}  // namespace ztrain
