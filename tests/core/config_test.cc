// Config parsing: strict keys and types, "auto", the batch triple, optimizer and scheduler
// semantics, ranges. DeepSpeed configs, refusals, files and docs: config_deepspeed_test.cc.
#include "core/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/config_schema.h"
#include "core/error.h"
#include "config_test_util.h"

namespace ztrain {
namespace {

using nlohmann::json;

// `j` with the value at JSON pointer `pointer` ("/zero_optimization/stage") set to `value`.
json With(json j, const std::string& pointer, json value) {
  j[json::json_pointer(pointer)] = std::move(value);
  return j;
}

std::string ErrorOf(const json& j, int world_size = 1) {
  return testing::ConfigErrorOf(j, world_size);
}

TEST(ConfigParseTest, DefaultConfigResolvesAutoAndBatch) {
  const Config c = ParseConfig(DefaultConfigJson());
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.vocab_size, 512);
  EXPECT_EQ(c.model.padded_vocab_size, 512);
  EXPECT_EQ(c.data.seq_len, 64);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-3);
  EXPECT_EQ(c.scheduler.type, "WarmupCosineLR");
  EXPECT_EQ(c.scheduler.total_num_steps, 300);
  EXPECT_EQ(c.training.steps, 300);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.steps_per_print, 25);
}

json::json_pointer Pointer(std::string path) {
  for (char& ch : path) ch = ch == '.' ? '/' : ch;
  return json::json_pointer("/" + path);
}

TEST(ConfigParseTest, ResolvedHasEveryApplicableKeyAndNoAuto) {
  const Config c =
      ParseConfig(With(DefaultConfigJson(), "/zero_optimization/reduce_bucket_size", "auto"));
  for (const ConfigKey& k : ConfigSchema::Get().keys()) {
    const auto& of = k.only_for;
    if (!of.empty() && std::find(of.begin(), of.end(), "WarmupCosineLR") == of.end()) continue;
    EXPECT_TRUE(c.resolved.contains(Pointer(k.path))) << k.path;
  }
  // `device` keeps "auto": each rank resolves it at start (run/device_select.h).
  EXPECT_EQ(c.resolved["device"], "auto");
  json others = c.resolved;
  others.erase("device");
  EXPECT_EQ(others.dump().find("\"auto\""), std::string::npos) << c.resolved.dump(2);
  EXPECT_EQ(c.resolved["zero_optimization"]["overlap_comm"], false);
  EXPECT_EQ(c.resolved["training"]["output_dir"], "runs/ztrain");
  EXPECT_EQ(c.resolved["csv_monitor"]["output_path"], "runs/ztrain");
}

TEST(ConfigParseTest, TypoInNestedKeyNamesPathAndNearestKey) {
  const std::string e =
      ErrorOf(With(DefaultConfigJson(), "/zero_optimization/stage3_prefetch_bucketsize", 5e7));
  EXPECT_NE(e.find("zero_optimization.stage3_prefetch_bucketsize: unknown key; did you mean "
                   "\"zero_optimization.stage3_prefetch_bucket_size\"?"),
            std::string::npos)
      << e;
}

TEST(ConfigParseTest, KeyInWrongSectionSuggestsItsSection) {
  const std::string e = ErrorOf(With(DefaultConfigJson(), "/reduce_bucket_size", 1000));
  EXPECT_NE(e.find("reduce_bucket_size: unknown key; did you mean "
                   "\"zero_optimization.reduce_bucket_size\""),
            std::string::npos)
      << e;
}

TEST(ConfigParseTest, DeprecatedDeepSpeedKeyNamesItsReplacement) {
  const std::string e = ErrorOf(With(DefaultConfigJson(), "/zero_optimization/cpu_offload", true));
  EXPECT_NE(e.find("zero_optimization.cpu_offload: unknown key; DeepSpeed deprecated it, use "
                   "\"zero_optimization.offload_optimizer\""),
            std::string::npos)
      << e;
}

TEST(ConfigParseTest, WrongTypeNamesPathAndExpectedType) {
  std::string e = ErrorOf(With(DefaultConfigJson(), "/optimizer/params/lr", "fast"));
  EXPECT_NE(e.find("optimizer.params.lr: expected number or \"auto\", got string \"fast\""),
            std::string::npos)
      << e;
  e = ErrorOf(With(DefaultConfigJson(), "/training/steps", 1.5));
  EXPECT_NE(e.find("training.steps: expected integer, got number 1.5"), std::string::npos) << e;
  e = ErrorOf(With(DefaultConfigJson(), "/training/steps", "auto"));
  EXPECT_NE(e.find("training.steps: expected integer; \"auto\" is not accepted here"),
            std::string::npos)
      << e;
  e = ErrorOf(With(DefaultConfigJson(), "/zero_optimization/offload_param/device", "gpu"));
  EXPECT_NE(e.find("zero_optimization.offload_param.device: expected one of \"none\", \"cpu\", "
                   "\"nvme\", got \"gpu\""),
            std::string::npos)
      << e;
  e = ErrorOf(json::array({1, 2}));
  EXPECT_NE(e.find("a config is a JSON object"), std::string::npos) << e;
}

// data.train as a list of weighted globs (Note [Data mixture]); weight defaults to 1, and every
// malformed entry is named by its index.
TEST(ConfigParseTest, DataTrainMayBeAWeightedList) {
  const json mix = json::array({{{"path", "web/*.bin"}, {"weight", 0.7}}, {{"path", "code.bin"}}});
  const Config c = ParseConfig(With(DefaultConfigJson(), "/data/train", mix));
  ASSERT_EQ(c.data.train_mixture.size(), 2u);
  EXPECT_EQ(c.data.train_mixture[0].path, "web/*.bin");
  EXPECT_EQ(c.data.train_mixture[0].weight, 0.7);
  EXPECT_EQ(c.data.train_mixture[1].weight, 1.0);
  EXPECT_TRUE(c.data.train.empty());
  EXPECT_FALSE(c.data.synthetic());
  EXPECT_EQ(c.resolved["data"]["train"][1]["weight"], 1.0);
  const json bad = json::array({{{"path", "a.bin"}, {"weight", 0}},
                                {{"weight", 1}},
                                {{"path", "b.bin"}, {"wieght", 2}},
                                "c.bin"});
  const std::string e = ErrorOf(With(DefaultConfigJson(), "/data/train", bad));
  for (const char* part : {"data.train[0].weight: expected a number > 0, got number 0",
                           "data.train[1].path: expected a glob of token shards",
                           "data.train[2].wieght: unknown key", "data.train[3]: expected {"}) {
    EXPECT_NE(e.find(part), std::string::npos) << part << " not in: " << e;
  }
  EXPECT_NE(ErrorOf(With(DefaultConfigJson(), "/data/train", json::array())).find("names no data"),
            std::string::npos);
}

// optimizer.param_groups (Note [Parameter groups]): absent is the no_decay rule over 1-D
// parameters; given, each entry resolves to all five keys; every malformed entry is named.
TEST(ConfigParseTest, ParamGroupsDefaultParseAndErrors) {
  const Config plain = ParseConfig(DefaultConfigJson());
  ASSERT_EQ(plain.optimizer.param_groups.size(), 1u);
  EXPECT_EQ(plain.optimizer.param_groups[0].name, "no_decay");
  EXPECT_EQ(plain.optimizer.param_groups[0].ndim, 1);
  EXPECT_EQ(plain.optimizer.param_groups[0].weight_decay, 0.0);
  EXPECT_TRUE(plain.optimizer.param_groups[0].params.empty());

  const json groups = json::array({{{"name", "emb"}, {"params", "wte.*"}, {"lr_scale", 0.5}},
                                   {{"params", json::array({"*.bias", "h.*.ln_?.weight"})},
                                    {"ndim", 1.0},
                                    {"weight_decay", 0.01}}});
  const Config c = ParseConfig(With(DefaultConfigJson(), "/optimizer/param_groups", groups));
  ASSERT_EQ(c.optimizer.param_groups.size(), 2u);
  const ParamGroupRule &a = c.optimizer.param_groups[0], &b = c.optimizer.param_groups[1];
  EXPECT_EQ(a.params, std::vector<std::string>{"wte.*"});
  EXPECT_EQ(a.ndim, 0);
  EXPECT_FALSE(a.weight_decay.has_value());
  EXPECT_EQ(a.lr_scale, 0.5);
  EXPECT_EQ(b.name, "group1");
  EXPECT_EQ(b.params.size(), 2u);
  EXPECT_EQ(b.ndim, 1);
  EXPECT_EQ(b.weight_decay, 0.01);
  EXPECT_EQ(c.resolved["optimizer"]["param_groups"][0]["weight_decay"], nullptr);
  EXPECT_TRUE(ParseConfig(With(DefaultConfigJson(), "/optimizer/param_groups", json::array()))
                  .optimizer.param_groups.empty());

  const json bad = json::array({{{"name", "x"}, {"params", "*.bias"}, {"lr_scale", -1}},
                                {{"name", "x"}, {"ndim", 1}},
                                {{"name", "default"}, {"ndim", 1}},
                                {{"name", "y"}},
                                {{"name", "z"}, {"params", json::array({""})}},
                                {{"name", "w"}, {"ndim", 2}, {"wieght_decay", 0.1}},
                                {{"name", "v"}, {"ndim", 2}, {"weight_decay", "none"}},
                                "no_decay"});
  const std::string e = ErrorOf(With(DefaultConfigJson(), "/optimizer/param_groups", bad));
  for (const char* part :
       {"optimizer.param_groups[0].lr_scale: expected a number >= 0",
        "optimizer.param_groups[1].name: \"x\" names an earlier group too",
        "optimizer.param_groups[2].name: \"default\" names the group of the parameters no rule",
        "optimizer.param_groups[3]: matches nothing: give \"params\"",
        "optimizer.param_groups[4].params: expected a glob or an array of globs",
        "optimizer.param_groups[5].wieght_decay: unknown key",
        "optimizer.param_groups[6].weight_decay: expected a number >= 0",
        "optimizer.param_groups[7]: expected {"}) {
    EXPECT_NE(e.find(part), std::string::npos) << part << " not in: " << e;
  }
  EXPECT_NE(ErrorOf(With(DefaultConfigJson(), "/optimizer/param_groups", "no_decay"))
                .find("optimizer.param_groups: expected array of parameter-group objects"),
            std::string::npos);
}

TEST(ConfigParseTest, FullRangeSeedIsAccepted) {
  const Config c =
      ParseConfig(With(DefaultConfigJson(), "/training/seed", 18446744073709551615ULL));
  EXPECT_EQ(c.training.seed, 18446744073709551615ULL);
}

TEST(ConfigParseTest, IntegralFloatIsAnInteger) {
  const Config c =
      ParseConfig(With(DefaultConfigJson(), "/zero_optimization/allgather_bucket_size", 2e8));
  EXPECT_TRUE(c.resolved["zero_optimization"]["allgather_bucket_size"].is_number_integer());
  EXPECT_EQ(c.zero.allgather_bucket_size, 200000000);
}

TEST(ConfigParseTest, AllProblemsAreReportedTogether) {
  json j = DefaultConfigJson();
  j["zero_optimization"]["stage3_prefetch_bucketsize"] = 1;
  j["optimizer"]["params"]["lr"] = "fast";
  j["model"]["n_head"] = 3;  // 128 % 3 != 0
  j["fp16"] = {{"enabled", true}, {"auto_cast", true}};
  const std::string e = ErrorOf(j);
  EXPECT_NE(e.find("invalid config (4 problems):"), std::string::npos) << e;
  for (const char* path :
       {"\n  zero_optimization.stage3_prefetch_bucketsize: ", "\n  optimizer.params.lr: ",
        "\n  model.n_embd: ", "\n  fp16.auto_cast: "}) {
    EXPECT_NE(e.find(path), std::string::npos) << path << " missing in:\n" << e;
  }
}

// --- the batch triple, as DeepSpeed's _set_batch_related_parameters -----------------------

json Batch(json tb, json micro, json gas) {
  json j = json::object();
  if (!tb.is_null()) j["train_batch_size"] = tb;
  if (!micro.is_null()) j["train_micro_batch_size_per_gpu"] = micro;
  if (!gas.is_null()) j["gradient_accumulation_steps"] = gas;
  return j;
}

void ExpectBatch(const json& j, int ws, int64_t tb, int64_t micro, int64_t gas) {
  const Config c = ParseConfig(j, ws);
  EXPECT_EQ(c.train_batch_size, tb) << j.dump() << " ws=" << ws;
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, micro) << j.dump() << " ws=" << ws;
  EXPECT_EQ(c.gradient_accumulation_steps, gas) << j.dump() << " ws=" << ws;
  EXPECT_EQ(c.world_size, ws);
}

TEST(ConfigBatchTest, DerivesTheMissingValuesLikeDeepSpeed) {
  for (int ws : {1, 4}) {
    ExpectBatch(Batch(32 * ws, 4, 8), ws, 32 * ws, 4, 8);               // all three, consistent
    ExpectBatch(Batch(32 * ws, 4, nullptr), ws, 32 * ws, 4, 8);         // gas = tb / micro / ws
    ExpectBatch(Batch(32 * ws, nullptr, 2), ws, 32 * ws, 16, 2);        // micro = tb / ws / gas
    ExpectBatch(Batch(nullptr, 4, 3), ws, 12 * ws, 4, 3);               // tb = micro * gas * ws
    ExpectBatch(Batch(16 * ws, nullptr, nullptr), ws, 16 * ws, 16, 1);  // micro = tb / ws
    ExpectBatch(Batch(nullptr, 5, nullptr), ws, 5 * ws, 5, 1);          // tb = micro * ws
    ExpectBatch(Batch("auto", 5, "auto"), ws, 5 * ws, 5, 1);            // "auto" = not given
  }
}

TEST(ConfigBatchTest, InconsistentTripleNamesTheNumbers) {
  std::string e = ErrorOf(Batch(32, 4, 2), 1);
  EXPECT_NE(e.find("train_batch_size: train_batch_size 32 != train_micro_batch_size_per_gpu 4 x "
                   "gradient_accumulation_steps 2 x world_size 1 (= 8)"),
            std::string::npos)
      << e;
  e = ErrorOf(Batch(32, 4, 2), 2);
  EXPECT_NE(e.find("32 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x "
                   "world_size 2 (= 16); fix one of them"),
            std::string::npos)
      << e;
}

TEST(ConfigBatchTest, SameTripleIsConsistentAtFourRanks) {
  ExpectBatch(Batch(32, 4, 2), 4, 32, 4, 2);
}

TEST(ConfigBatchTest, IndivisibleTrainBatchSaysWhatItMustDivide) {
  // DeepSpeed: gas = 8 // 4 // 4 = 0, then its assertion fails.
  const std::string e = ErrorOf(Batch(8, 4, nullptr), 4);
  EXPECT_NE(e.find("train_batch_size 8 != train_micro_batch_size_per_gpu 4 x "
                   "gradient_accumulation_steps 0 x world_size 4 (= 0); train_batch_size must "
                   "be a multiple of train_micro_batch_size_per_gpu x world_size = 16"),
            std::string::npos)
      << e;
}

TEST(ConfigBatchTest, NeitherTrainNorMicroBatchIsAnError) {
  for (const json& j : {Batch(nullptr, nullptr, 4), Batch(nullptr, nullptr, nullptr)}) {
    const std::string e = ErrorOf(j);
    EXPECT_NE(e.find("either train_batch_size or train_micro_batch_size_per_gpu must be given"),
              std::string::npos)
        << e;
  }
}

TEST(ConfigBatchTest, NonPositiveValuesAreErrors) {
  const std::string e = ErrorOf(Batch(nullptr, 0, -1));
  EXPECT_NE(e.find("train_micro_batch_size_per_gpu: must be > 0, got 0"), std::string::npos) << e;
  EXPECT_NE(e.find("gradient_accumulation_steps: must be > 0, got -1"), std::string::npos) << e;
}

// --- "auto" ----------------------------------------------------------------------------------

TEST(ConfigAutoTest, PaddedVocabRoundsUpTo128) {
  for (auto [vocab, padded] : {std::pair{50257, 50304}, {512, 512}, {513, 640}, {1, 128}}) {
    const Config c = ParseConfig(With(DefaultConfigJson(), "/model/vocab_size", vocab));
    EXPECT_EQ(c.model.padded_vocab_size, padded) << vocab;
  }
}

TEST(ConfigAutoTest, ValuesDerivedFromOtherKeys) {
  json j = DefaultConfigJson();
  j["model"]["max_seq_len"] = 48;
  j["data"].erase("seq_len");  // absent = "auto"
  j["optimizer"]["params"] = {
      {"lr", "auto"}, {"betas", "auto"}, {"eps", "auto"}, {"weight_decay", "auto"}};
  j["scheduler"] = {{"type", "WarmupDecayLR"},
                    {"params", {{"warmup_max_lr", "auto"}, {"total_num_steps", "auto"}}}};
  j["zero_optimization"] = {{"reduce_bucket_size", "auto"},
                            {"stage3_prefetch_bucket_size", "auto"},
                            {"stage3_param_persistence_threshold", "auto"}};
  j["fp16"] = {{"enabled", "auto"}};
  const Config c = ParseConfig(j);
  EXPECT_EQ(c.data.seq_len, 48);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 5e-5);  // the HF Trainer's defaults
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 5e-5);  // = optimizer lr
  EXPECT_EQ(c.scheduler.total_num_steps, 300);        // = training.steps
  EXPECT_EQ(c.zero.reduce_bucket_size, 128 * 128);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 14745);  // 0.9 * 128^2
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 1280);
  EXPECT_EQ(c.resolved["fp16"]["enabled"], false);
}

// --- Note [Size limits] -------------------------------------------------------------------

// Absurd sizes are named errors, never an overflow downstream (a micro-batch of 2^62 used to
// die of SIGFPE in the loader; a width of 2^32 wrapped in ModelConfig's int).
TEST(ConfigSizeTest, SizesPastTheLimitsAreNamed) {
  const int64_t huge = int64_t{1} << 62;
  std::string e = ErrorOf(With(DefaultConfigJson(), "/train_micro_batch_size_per_gpu", huge));
  EXPECT_NE(e.find("train_micro_batch_size_per_gpu 4611686018427387904 x "
                   "gradient_accumulation_steps 1 x world_size 1 exceeds"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("Note [Size limits]"), std::string::npos) << e;
  // micro x gas x world overflows int64 itself.
  json j = With(DefaultConfigJson(), "/train_micro_batch_size_per_gpu", huge);
  j["gradient_accumulation_steps"] = huge;
  e = ErrorOf(j, 4);
  EXPECT_NE(e.find("exceeds"), std::string::npos) << e;
  e = ErrorOf(With(DefaultConfigJson(), "/model/n_embd", int64_t{1} << 32));
  EXPECT_NE(e.find("model.n_embd: must be <= 2147483647"), std::string::npos) << e;
  e = ErrorOf(With(DefaultConfigJson(), "/model/vocab_size", INT64_MAX));
  EXPECT_NE(e.find("model: n_layer 4, n_embd 128, padded_vocab_size 9223372036854775807"),
            std::string::npos)
      << e;
  // One micro-batch's tokens, and its activations.
  json seq = With(DefaultConfigJson(), "/model/max_seq_len", int64_t{1} << 40);
  seq["train_micro_batch_size_per_gpu"] = int64_t{1} << 20;
  e = ErrorOf(seq);
  EXPECT_NE(e.find("tokens per micro-batch; lower train_micro_batch_size_per_gpu or data.seq_len"),
            std::string::npos)
      << e;
  e = ErrorOf(With(DefaultConfigJson(), "/train_micro_batch_size_per_gpu", int64_t{1} << 36));
  EXPECT_NE(e.find("logits or saved activations per micro-batch"), std::string::npos) << e;
  // The largest sizes that pass still make a valid config.
  const Config ok = ParseConfig(With(DefaultConfigJson(), "/train_micro_batch_size_per_gpu",
                                     int64_t{1} << 24));
  EXPECT_EQ(ok.train_batch_size, int64_t{1} << 24);
}

// --- optimizer -------------------------------------------------------------------------------

TEST(ConfigOptimizerTest, AdamVsAdamWVsL2) {
  const json base = DefaultConfigJson();
  Config c = ParseConfig(With(base, "/optimizer/type", "adamw"));  // case-insensitive
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  c = ParseConfig(With(base, "/optimizer/type", "Adam"));  // DeepSpeed: adam_w_mode defaults on
  EXPECT_EQ(c.optimizer.type, "Adam");
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  c = ParseConfig(
      With(With(base, "/optimizer/type", "ADAM"), "/optimizer/params/adam_w_mode", false));
  EXPECT_EQ(c.optimizer.type, "Adam");
  EXPECT_FALSE(c.optimizer.adam_w_mode);  // L2
  const std::string e = ErrorOf(With(base, "/optimizer/params/adam_w_mode", false));
  EXPECT_NE(e.find("optimizer.params.adam_w_mode: false has no effect with type AdamW"),
            std::string::npos)
      << e;
}

TEST(ConfigOptimizerTest, FusedAdamDefaults) {
  for (const json& optimizer : {json{{"type", "Adam"}}, json(nullptr)}) {
    json j = DefaultConfigJson();
    if (optimizer.is_null())
      j.erase("optimizer");
    else
      j["optimizer"] = optimizer;
    const Config c = ParseConfig(j);
    EXPECT_EQ(c.optimizer.type, optimizer.is_null() ? "AdamW" : "Adam");
    EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
    EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.9);
    EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);
    EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
    EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.0);
    EXPECT_TRUE(c.optimizer.bias_correction);
  }
}

TEST(ConfigOptimizerTest, RangesSayHowToFix) {
  const json base = DefaultConfigJson();
  EXPECT_NE(ErrorOf(With(base, "/optimizer/params/betas", {0.9, 1.0}))
                .find("optimizer.params.betas: each beta must be in [0, 1), got [0.9,1.0]"),
            std::string::npos);
  EXPECT_NE(ErrorOf(With(base, "/optimizer/params/betas", {0.9}))
                .find("optimizer.params.betas: expected array of 2 numbers"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf(With(base, "/optimizer/params/eps", 0)).find("optimizer.params.eps: must be > 0"),
      std::string::npos);
  EXPECT_NE(
      ErrorOf(With(base, "/optimizer/params/lr", -1e-3)).find("optimizer.params.lr: must be >= 0"),
      std::string::npos);
}

// --- scheduler -------------------------------------------------------------------------------

json WithScheduler(const std::string& type, json params = json::object()) {
  return With(DefaultConfigJson(), "/scheduler", {{"type", type}, {"params", params}});
}

TEST(ConfigSchedulerTest, DeepSpeedDefaults) {
  Config c = ParseConfig(WithScheduler("WarmupLR"));
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 0.001);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(c.scheduler.warmup_type, "log");
  EXPECT_FALSE(c.resolved["scheduler"]["params"].contains("total_num_steps"));
  c = ParseConfig(WithScheduler("WarmupDecayLR", {{"total_num_steps", 500}}));
  EXPECT_EQ(c.scheduler.total_num_steps, 500);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 0.001);
  c = ParseConfig(WithScheduler("WarmupCosineLR", {{"total_num_steps", 500}}));
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_ratio, 0.0);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 1000);
  EXPECT_DOUBLE_EQ(c.scheduler.cos_min_ratio, 0.0001);
  EXPECT_EQ(c.scheduler.warmup_type, "log");
  EXPECT_FALSE(c.resolved["scheduler"]["params"].contains("warmup_max_lr"));
  json j = DefaultConfigJson();
  j.erase("scheduler");
  EXPECT_EQ(ParseConfig(j).scheduler.type, "");  // constant lr
}

TEST(ConfigSchedulerTest, DecayingSchedulesNeedTotalSteps) {
  for (const char* type : {"WarmupDecayLR", "WarmupCosineLR"}) {
    const std::string e = ErrorOf(WithScheduler(type));
    EXPECT_NE(e.find(std::string("scheduler.params.total_num_steps: required by ") + type),
              std::string::npos)
        << e;
  }
}

TEST(ConfigSchedulerTest, ParameterOfAnotherScheduleIsNamed) {
  const std::string e = ErrorOf(WithScheduler("WarmupLR", {{"cos_min_ratio", 0.1}}));
  EXPECT_NE(e.find("scheduler.params.cos_min_ratio: not a parameter of scheduler type WarmupLR; "
                   "it belongs to WarmupCosineLR"),
            std::string::npos)
      << e;
}

// --- ranges ----------------------------------------------------------------------------------

TEST(ConfigRangeTest, ModelAndDataShapes) {
  const json base = DefaultConfigJson();
  EXPECT_NE(ErrorOf(With(base, "/model/n_head", 6))
                .find("model.n_embd: 128 is not divisible by model.n_head 6; use a multiple of "
                      "n_head (e.g. 126 or 132)"),
            std::string::npos);
  EXPECT_NE(ErrorOf(With(base, "/model/padded_vocab_size", 500))
                .find("model.padded_vocab_size: 500 is smaller than model.vocab_size 512; use "
                      ">= 512 or \"auto\" (512)"),
            std::string::npos);
  EXPECT_NE(ErrorOf(With(base, "/data/seq_len", 65))
                .find("data.seq_len: 65 must be in [1, model.max_seq_len = 64]"),
            std::string::npos);
  EXPECT_NE(ErrorOf(With(base, "/training/steps", -1)).find("training.steps: must be >= 0, got -1"),
            std::string::npos);
  EXPECT_NE(ErrorOf(With(base, "/zero_optimization/stage", 4))
                .find("zero_optimization.stage: must be 0, 1, 2 or 3, got 4"),
            std::string::npos);
}

// --- device ----------------------------------------------------------------------------------

TEST(ConfigDeviceTest, DefaultIsAutoAndEverySpellingIsKept) {
  EXPECT_EQ(ParseConfig(DefaultConfigJson()).device, "auto");
  for (const char* device : {"auto", "cpu", "cuda", "cuda:0", "cuda:7", "cuda:12"}) {
    const Config c = ParseConfig(With(DefaultConfigJson(), "/device", device));
    EXPECT_EQ(c.device, device);
    EXPECT_EQ(c.resolved["device"], device);
  }
}

TEST(ConfigDeviceTest, BadValueNamesKeyValueAndAcceptedValues) {
  for (const char* bad : {"gpu", "CUDA", "cuda:", "cuda:-1", "cuda:one", "cuda:0:1", "cpu:0"}) {
    const std::string e = ErrorOf(With(DefaultConfigJson(), "/device", bad));
    EXPECT_NE(e.find(std::string("device: expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\" "
                                 "(N a GPU index: 0, 1, ...), got \"") + bad + "\""),
              std::string::npos)
        << e;
  }
  const std::string e = ErrorOf(With(DefaultConfigJson(), "/device", 0));
  EXPECT_NE(e.find("device: expected string, got number 0"), std::string::npos) << e;
}

TEST(ConfigDeviceTest, ParseDeviceSettingTakesTheSettingApart) {
  using Kind = DeviceSetting::Kind;
  EXPECT_EQ(ParseDeviceSetting("auto")->kind, Kind::kAuto);
  EXPECT_EQ(ParseDeviceSetting("cpu")->kind, Kind::kCpu);
  EXPECT_EQ(ParseDeviceSetting("cuda")->kind, Kind::kCuda);
  EXPECT_EQ(ParseDeviceSetting("cuda")->index, -1);
  EXPECT_EQ(ParseDeviceSetting("cuda:3")->kind, Kind::kCuda);
  EXPECT_EQ(ParseDeviceSetting("cuda:3")->index, 3);
  EXPECT_EQ(ParseDeviceSetting("cuda:10")->index, 10);
  for (const char* bad : {"", "Cpu", "cuda:+1", "cuda:99999999999", "cuda:1 ", "cuda1"}) {
    EXPECT_FALSE(ParseDeviceSetting(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace ztrain

namespace ztrain {
namespace {

using nlohmann::json;

// The batch triple is resolved for the data-parallel size world / (pp x tp), as DeepSpeed does.
TEST(ConfigLayoutTest, PipelineAndTensorSizesDivideTheWorld) {
  json j = DefaultConfigJson();
  j["pipeline"] = {{"stages", 2}, {"partition", "uniform"}, {"schedule", "GPipe"}};
  j["train_micro_batch_size_per_gpu"] = 2;
  j["gradient_accumulation_steps"] = 3;
  j.erase("train_batch_size");
  const Config c = ParseConfig(j, 8);
  EXPECT_EQ(c.world_size, 8);
  EXPECT_EQ(c.dp_size, 4);
  EXPECT_EQ(c.train_batch_size, 2 * 3 * 4);
  EXPECT_EQ(c.pipeline_stages, 2);
  EXPECT_EQ(c.pipeline_partition, "uniform");
  EXPECT_EQ(c.pipeline_schedule, "gpipe");
  const Config d = ParseConfig(DefaultConfigJson(), 1);
  EXPECT_EQ(d.pipeline_partition, "parameters");
  EXPECT_EQ(d.pipeline_schedule, "1f1b");

  const std::string e = testing::ConfigErrorOf(j, 5);
  EXPECT_NE(e.find("pipeline.stages: the world of 5 ranks does not divide into pipeline.stages 2 "
                   "x tensor_parallel.size 1 x context_parallel.size 1; launch a multiple of 2 "
                   "ranks"),
            std::string::npos)
      << e;
  j["pipeline"]["partition"] = "type:transformer";
  EXPECT_NE(testing::ConfigErrorOf(j, 8).find("pipeline.partition"), std::string::npos);
}

// Note [Context parallelism]: dp = world / (pp x tp x cp), the batch resolved for it; the
// sequence and (Ulysses) the heads of each tensor-parallel rank must split over cp.
TEST(ConfigLayoutTest, ContextParallelSizeDividesTheWorldTheSequenceAndTheHeads) {
  json j = DefaultConfigJson();
  j["model"]["n_head"] = 8;
  j["model"]["n_kv_head"] = 2;
  j["model"]["n_embd"] = 64;
  j["data"]["seq_len"] = 64;
  j["context_parallel"] = {{"size", 4}};
  j["train_micro_batch_size_per_gpu"] = 2;
  j["gradient_accumulation_steps"] = 1;
  j.erase("train_batch_size");
  const Config c = ParseConfig(j, 8);
  EXPECT_EQ(c.context_parallel_size, 4);
  EXPECT_EQ(c.context_parallel_algorithm, "ulysses");
  EXPECT_EQ(c.dp_size, 2);
  EXPECT_EQ(c.train_batch_size, 2 * 2);
  EXPECT_EQ(ParseConfig(DefaultConfigJson(), 1).context_parallel_size, 1);

  const auto only_problem = [&](const json& config, int world, const std::string& message) {
    const std::string e = testing::ConfigErrorOf(config, world);
    EXPECT_NE(e.find("(1 problem):\n  " + message), std::string::npos) << e;
  };
  only_problem(j, 6,
               "context_parallel.size: the world of 6 ranks does not divide into "
               "pipeline.stages 1 x tensor_parallel.size 1 x context_parallel.size 4; launch a "
               "multiple of 4 ranks (dp x cp x pp x tp)");
  json seq = j;
  seq["data"]["seq_len"] = 62;
  only_problem(seq, 4,
               "context_parallel.size: context_parallel.size 4 does not divide data.seq_len 62; "
               "use a seq_len that is a multiple of 4");
  json heads = j;
  heads["context_parallel"]["size"] = 3;
  heads["data"]["seq_len"] = 63;
  only_problem(heads, 3,
               "context_parallel.size: context_parallel.size 3 does not divide the 8 query heads "
               "of each tensor-parallel rank (model.n_head 8 / tensor_parallel.size 1)");
  json kv = j;
  kv["model"]["n_kv_head"] = 8;
  kv["model"]["n_head"] = 24;
  kv["model"]["n_embd"] = 96;
  kv["context_parallel"]["size"] = 6;
  kv["data"]["seq_len"] = 60;
  only_problem(kv, 6,
               "context_parallel.size: context_parallel.size 6 and the 8 key/value heads of each "
               "tensor-parallel rank (model.n_kv_head 8 / tensor_parallel.size 1) neither divide "
               "each other");
  json tp = j;
  tp["tensor_parallel"] = {{"size", 2}};
  tp["model"]["n_kv_head"] = 4;
  EXPECT_EQ(ParseConfig(tp, 8).dp_size, 1);  // 4 heads per tp rank over cp 4; kv 2 replicated
  tp["context_parallel"]["size"] = 8;
  only_problem(tp, 16,
               "context_parallel.size: context_parallel.size 8 does not divide the 4 query heads "
               "of each tensor-parallel rank (model.n_head 8 / tensor_parallel.size 2)");
  tp["context_parallel"]["size"] = 4;
  tp["tensor_parallel"]["sequence_parallel"] = true;
  tp["data"]["seq_len"] = 36;
  only_problem(tp, 8,
               "tensor_parallel.sequence_parallel: data.seq_len 36 / context_parallel.size 4 = 9 "
               "tokens per rank do not divide over tensor_parallel.size 2");
  // Ring attention keeps every head (3 does not divide 8 heads: fine) and cuts the sequence
  // into 2 x size chunks.
  json ring = j;
  ring["model"]["max_seq_len"] = 66;
  ring["context_parallel"] = {{"size", 3}, {"algorithm", "ring"}};
  ring["data"]["seq_len"] = 66;
  EXPECT_EQ(ParseConfig(ring, 3).context_parallel_algorithm, "ring");
  ring["data"]["seq_len"] = 63;
  only_problem(ring, 3,
               "context_parallel.size: ring attention cuts data.seq_len 63 into 2 x "
               "context_parallel.size = 6 chunks, which do not divide it; use a seq_len that is a "
               "multiple of 6");
  json bad = j;
  bad["context_parallel"]["algorithm"] = "a2a";
  EXPECT_NE(testing::ConfigErrorOf(bad, 4).find("context_parallel.algorithm"), std::string::npos);
  bad["context_parallel"] = {{"size", 0}};
  EXPECT_NE(testing::ConfigErrorOf(bad, 4).find("context_parallel.size"), std::string::npos);
}

}  // namespace
}  // namespace ztrain
