// Config: real DeepSpeed configs, refused features, config files and the generated reference.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <map>
#include <string>

#include "core/config.h"
#include "core/config_schema.h"
#include "core/error.h"
#include "config_test_util.h"

namespace ztrain {
namespace {

using nlohmann::json;

// A ZeRO-0 fp32 config as DeepSpeed users write it (no ztrain sections: model defaults).
constexpr const char* kDeepSpeedConfig = R"({
  "train_batch_size": 64,
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 2,
  "steps_per_print": 100,
  "optimizer": {"type": "AdamW",
                "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupLR",
                "params": {"warmup_min_lr": 0, "warmup_max_lr": 6e-4, "warmup_num_steps": 100}},
  "gradient_clipping": 1.0,
  "prescale_gradients": false,
  "fp16": {"enabled": false, "loss_scale": 0, "loss_scale_window": 1000,
           "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": false},
  "zero_optimization": {"stage": 0, "allgather_partitions": true, "allgather_bucket_size": 5e8,
                        "overlap_comm": false, "reduce_scatter": true,
                        "reduce_bucket_size": 5e8, "contiguous_gradients": true,
                        "offload_optimizer": {"device": "none"},
                        "offload_param": {"device": "none"}},
  "aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 1, "single_submit": false,
          "overlap_events": true},
  "activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": false,
                               "contiguous_memory_optimization": false,
                               "number_checkpoints": null,
                               "synchronize_checkpoint_boundary": false, "profile": false},
  "wall_clock_breakdown": true,
  "comms_logger": {"enabled": true, "verbose": false, "prof_all": true, "debug": false},
  "flops_profiler": {"enabled": false, "profile_step": 1, "module_depth": -1,
                     "top_modules": 1, "detailed": true, "output_file": null},
  "tensorboard": {"enabled": false, "output_path": "log/", "job_name": "gpt2"},
  "csv_monitor": {"enabled": true, "output_path": "csv/", "job_name": "gpt2"}
})";

std::string ErrorOf(const json& j, int world_size = 1) {
  return testing::ConfigErrorOf(j, world_size);
}

TEST(ConfigDeepSpeedTest, RealDeepSpeedConfigIsAccepted) {
  const Config c = ParseConfig(json::parse(kDeepSpeedConfig), /*world_size=*/4);
  EXPECT_EQ(c.train_batch_size, 64);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.scheduler.type, "WarmupLR");
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 6e-4);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 100);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_TRUE(c.comms_logger.enabled);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_TRUE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.output_path, "csv/");
  EXPECT_EQ(c.model.n_layer, 12);  // no model section: GPT-2 124M
  EXPECT_EQ(c.data.seq_len, 1024);
  // The same config is inconsistent on 2 ranks: 64 != 8 x 2 x 2.
  EXPECT_NE(ErrorOf(json::parse(kDeepSpeedConfig), 2).find("64 != "), std::string::npos);
}

TEST(ConfigDeepSpeedTest, AioThreadCountIsTheOlderNameOfIntraOpParallelism) {
  auto threads = [](const char* aio) {
    json j = json::parse(R"({"train_micro_batch_size_per_gpu": 1})");
    j["aio"] = json::parse(aio);
    return ParseConfig(j).aio.intra_op_parallelism;
  };
  EXPECT_EQ(threads("{}"), 1);
  EXPECT_EQ(threads(R"({"thread_count": 3})"), 3);
  EXPECT_EQ(threads(R"({"intra_op_parallelism": 2})"), 2);
  EXPECT_EQ(threads(R"({"intra_op_parallelism": 2, "thread_count": 3})"), 2);  // the newer wins
  EXPECT_NE(ErrorOf(json::parse(R"({"train_micro_batch_size_per_gpu": 1,
                                   "aio": {"thread_count": -1}})"))
                .find("aio.thread_count"),
            std::string::npos);
}

TEST(ConfigDeepSpeedTest, HuggingFaceAutoConfigIsAccepted) {
  const json j = json::parse(R"({
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                             "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 0, "reduce_bucket_size": "auto"},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"
  })");
  const std::string e = ErrorOf(j);  // nothing gives a batch size
  EXPECT_NE(e.find("invalid config (1 problem):\n  train_batch_size: either"), std::string::npos)
      << e;
  json fixed = j;
  fixed["train_micro_batch_size_per_gpu"] = 2;
  const Config c = ParseConfig(fixed, 4);
  EXPECT_EQ(c.train_batch_size, 8);  // micro x gas x world
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  // The HF Trainer's defaults (Note [Resolving "auto"]).
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 5e-5);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 5e-5);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 0);
  EXPECT_EQ(c.scheduler.total_num_steps, 100);  // training.steps default
  EXPECT_FALSE(c.precision.fp16);
  EXPECT_FALSE(c.precision.bf16);  // ParseConfig alone probes no hardware
  EXPECT_EQ(c.zero.reduce_bucket_size, 768 * 768);
  // Every "auto" is recorded with its value and reason.
  std::map<std::string, AutoChoice> chosen;
  for (const AutoChoice& a : c.auto_choices) chosen[a.path] = a;
  EXPECT_EQ(chosen.size(), 14u);  // the 15 "auto"s but the micro-batch
  EXPECT_EQ(chosen.at("train_batch_size").value, 8);
  EXPECT_EQ(chosen.at("optimizer.params.lr").reason, "the HF Trainer's default learning_rate");
  EXPECT_EQ(chosen.at("zero_optimization.reduce_bucket_size").value, 768 * 768);
  EXPECT_NE(chosen.at("zero_optimization.reduce_bucket_size").reason.find("n_embd^2"),
            std::string::npos);
}

struct Refused {
  const char* pointer;
  json value;
  const char* message;  // expected as the only problem, after "\n  "
};

TEST(ConfigDeepSpeedTest, EachRefusedFeatureNamesItsKey) {
  const Refused cases[] = {
      // Offload where DeepSpeed does not allow it (these configs are at stage 0).
      {"/zero_optimization/offload_optimizer",
       {{"device", "cpu"}, {"pin_memory", true}},
       "zero_optimization.offload_optimizer.device: optimizer offload needs ZeRO stage 1, 2 or 3"},
      {"/zero_optimization/offload_param/device", "cpu",
       "zero_optimization.offload_param.device: parameter offload needs ZeRO stage 3"},
      {"/fp16",
       {{"enabled", true}, {"auto_cast", true}},
       "fp16.auto_cast: ztrain does not autocast"},
      {"/fp16/fp16_master_weights_and_grads", true,
       "fp16.fp16_master_weights_and_grads: fp16 master weights and gradients are not built"},
      {"/bf16/bf16_master_weights_and_grads", true,
       "bf16.bf16_master_weights_and_grads: bf16 master weights and gradients are not built"},
      {"/bf16/bf16_optimizer_states", true,
       "bf16.bf16_optimizer_states: bf16 optimizer states are not built"},
      {"/amp", {{"enabled", true}, {"opt_level", "O1"}}, "amp.enabled: Apex AMP is not available"},
      {"/torch_autocast", {{"enabled", true}}, "torch_autocast.enabled: autocast is not available"},
      {"/tensor_parallel/autotp_size", 4,
       "tensor_parallel.autotp_size: DeepSpeed's AutoTP is not built yet; use tensor_parallel.size"},
      {"/pipeline/activation_checkpoint_interval", 2,
       "pipeline.activation_checkpoint_interval: checkpointing every N pipeline layers is not "
       "built yet; use activation_checkpointing.enabled"},
      {"/optimizer/type", "Lamb",
       "optimizer.type: optimizer Lamb is not built yet; supported: Adam, AdamW"},
      {"/scheduler",
       {{"type", "OneCycle"}, {"params", {{"cycle_min_lr", 1e-4}}}},
       "scheduler.type: scheduler OneCycle is not built yet; supported (exact spelling): "
       "WarmupLR, WarmupDecayLR, WarmupCosineLR"},
      {"/scheduler/type", "warmuplr", "scheduler.type: scheduler warmuplr is not built yet"},
      {"/flops_profiler/enabled", true, "flops_profiler.enabled: the FLOPs profiler"},
      {"/tensorboard/enabled", true, "tensorboard.enabled: the TensorBoard monitor"},
      {"/wandb/enabled", true, "wandb.enabled: the W&B monitor"},
      {"/comet/enabled", true, "comet.enabled: the Comet monitor"},
      {"/elasticity",
       {{"enabled", true}, {"max_train_batch_size", 2000}},
       "elasticity.enabled: elasticity is not built yet"},
      {"/autotuning", {{"enabled", true}}, "autotuning.enabled: autotuning is not built yet"},
      {"/compression_training",
       {{"weight_quantization", {{"shared_parameters", {{"enabled", true}}}}}},
       "compression_training.weight_quantization.shared_parameters.enabled: "
       "compression_training is not built yet"},
      {"/data_efficiency",
       {{"enabled", false}, {"data_routing", {{"enabled", true}}}},
       "data_efficiency.data_routing.enabled: data_efficiency is not built yet"},
      {"/sparse_gradients", true,
       "sparse_gradients: sparse (CSR) gradient all-reduce is not built yet"},
      {"/communication_data_type", "fp16",
       "communication_data_type: fp16 gradient communication is not built yet"},
      {"/sparse_attention", {{"mode", "fixed"}}, "sparse_attention: sparse attention"},
      {"/optimizer/params/max_grad_norm", 1.0,
       "optimizer.params.max_grad_norm: DeepSpeed ignores max_grad_norm in fp32 training"},
  };
  for (const Refused& r : cases) {
    json j = DefaultConfigJson();
    j[json::json_pointer(r.pointer)] = r.value;
    const std::string e = ErrorOf(j);
    EXPECT_NE(e.find(std::string("invalid config (1 problem):\n  ") + r.message), std::string::npos)
        << r.pointer << " gave:\n"
        << e;
  }
}

TEST(ConfigDeepSpeedTest, OffloadIsParsedAndCheckedAsDeepSpeedAllowsIt) {
  const json ok = json::parse(R"({"train_micro_batch_size_per_gpu": 1,
    "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": "/nvme", "buffer_count": 3,
                        "buffer_size": 1000, "max_in_cpu": 10, "pin_memory": true},
      "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme2", "pipeline_read": true,
                            "pipeline_write": true}}})");
  const Config c = ParseConfig(ok);
  EXPECT_EQ(c.zero.offload_param.device, "nvme");
  EXPECT_EQ(c.zero.offload_param.nvme_path, "/nvme");
  EXPECT_EQ(c.zero.offload_param.buffer_count, 3);
  EXPECT_EQ(c.zero.offload_param.buffer_size, 1000);
  EXPECT_EQ(c.zero.offload_param.max_in_cpu, 10);
  EXPECT_TRUE(c.zero.offload_param.pin_memory);
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, "/nvme2");
  EXPECT_TRUE(c.zero.offload_optimizer.pipeline_read);
  EXPECT_TRUE(c.zero.offload_optimizer.pipeline_write);
  json no_path = ok;
  no_path["zero_optimization"]["offload_param"].erase("nvme_path");
  EXPECT_NE(ErrorOf(no_path).find("zero_optimization.offload_param.nvme_path: must name a "
                                  "directory for the swap files"),
            std::string::npos);
  json few_buffers = ok;
  few_buffers["zero_optimization"]["offload_optimizer"]["buffer_count"] = 2;
  EXPECT_NE(ErrorOf(few_buffers).find("zero_optimization.offload_optimizer.buffer_count: must "
                                      "be >= 3"),
            std::string::npos);
  json no_depth = ok;  // 0 parses as an unsigned JSON number: still checked
  no_depth["aio"] = {{"queue_depth", 0}};
  EXPECT_NE(ErrorOf(no_depth).find("aio.queue_depth: must be >= 1, got 0"), std::string::npos);
  json stage2 = ok;
  stage2["zero_optimization"]["stage"] = 2;
  EXPECT_NE(ErrorOf(stage2).find("parameter offload needs ZeRO stage 3"), std::string::npos);
}

TEST(ConfigDeepSpeedTest, RefusalsLookAtSchemaKeys) {
  for (const ConfigRefusal& r : ConfigRefusals()) {
    EXPECT_NE(ConfigSchema::Get().Find(r.path), nullptr) << r.path;
  }
}

// --- files -----------------------------------------------------------------------------------

class ConfigFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("ztrain_config_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::string LoadError(const std::string& path) {
    try {
      LoadConfigFile(path);
    } catch (const ConfigError& e) {
      return e.what();
    }
    ADD_FAILURE() << path << " loaded without error";
    return "";
  }
};

TEST_F(ConfigFileTest, SyntaxErrorNamesFileLineAndColumn) {
  const std::string path =
      Write("syntax.json", "{\n  \"train_batch_size\": 8,\n  \"steps_per_print\": ,\n}\n");
  const std::string e = LoadError(path);
  EXPECT_NE(e.find("config file " + path + ":3:22: JSON syntax error: "), std::string::npos) << e;
}

TEST_F(ConfigFileTest, MissingFileIsNamed) {
  const std::string e = LoadError("/nonexistent/ds_config.json");
  EXPECT_NE(e.find("config file /nonexistent/ds_config.json: cannot open"), std::string::npos) << e;
}

TEST_F(ConfigFileTest, DuplicateKeyIsNamed) {
  const std::string e =
      LoadError(Write("dup.json", R"({"model": {"n_layer": 2, "n_head": 2, "n_layer": 3}})"));
  EXPECT_NE(e.find("duplicate keys"), std::string::npos) << e;
  EXPECT_NE(e.find("\n  model.n_layer"), std::string::npos) << e;
}

TEST_F(ConfigFileTest, ConfigErrorsNameTheFile) {
  const std::string path = Write("typo.json", R"({"train_micro_batch_size_per_gpu": 2,
                                                  "stpes_per_print": 5})");
  const std::string e = LoadError(path);
  EXPECT_NE(e.find("config file " + path +
                   ": invalid config (1 problem):\n  stpes_per_print: "
                   "unknown key; did you mean \"steps_per_print\"?"),
            std::string::npos)
      << e;
}

TEST_F(ConfigFileTest, RepositoryConfigsParse) {
  const std::string dir = std::string(ZTRAIN_SOURCE_DIR) + "/configs/";
  EXPECT_EQ(ReadConfigJson(dir + "default.json"), DefaultConfigJson());
  EXPECT_EQ(LoadConfigFile(dir + "default.json").resolved,
            ParseConfig(DefaultConfigJson()).resolved);
  const Config gpt2 = LoadConfigFile(dir + "gpt2_124m.json", /*world_size=*/4);
  EXPECT_EQ(gpt2.model.n_embd, 768);
  EXPECT_EQ(gpt2.model.padded_vocab_size, 50304);
  EXPECT_EQ(gpt2.data.seq_len, 64);
  EXPECT_EQ(gpt2.train_batch_size, 4 * 4);
  const Config tiny = LoadConfigFile(dir + "tiny.json");
  EXPECT_LT(tiny.model.n_embd, 128);
  for (int stage = 1; stage <= 3; ++stage) {
    const Config zero = LoadConfigFile(dir + "zero" + std::to_string(stage) + ".json", 2);
    EXPECT_EQ(zero.zero.stage, stage);
    EXPECT_EQ(zero.training.output_dir, "runs/zero" + std::to_string(stage));
  }
  const Config pipeline = LoadConfigFile(dir + "pipeline.json", 4);
  EXPECT_EQ(pipeline.pipeline_stages, 2);
  EXPECT_EQ(pipeline.dp_size, 2);
  EXPECT_EQ(pipeline.train_batch_size, 8 * 4 * 2);
  const Config three_d = LoadConfigFile(dir + "3d.json", 8);
  EXPECT_EQ(three_d.tensor_parallel_size, 2);
  EXPECT_EQ(three_d.dp_size, 2);
}

// --- the generated reference -----------------------------------------------------------------

std::string ReadDocs() {
  std::ifstream in(std::string(ZTRAIN_SOURCE_DIR) + "/docs/config.md");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ConfigDocsTest, ReferenceIsUpToDate) {
  const std::string generated = ConfigReferenceMarkdown();
  if (std::getenv("ZTRAIN_UPDATE_DOCS") != nullptr) {
    std::ofstream(std::string(ZTRAIN_SOURCE_DIR) + "/docs/config.md") << generated;
  }
  EXPECT_TRUE(ReadDocs() == generated)
      << "docs/config.md is stale; regenerate it with ZTRAIN_UPDATE_DOCS=1 config_test "
         "--gtest_filter=ConfigDocsTest.*";
}

TEST(ConfigDocsTest, EveryKeyAndRefusalIsDocumented) {
  const std::string docs = ReadDocs();
  for (const ConfigKey& k : ConfigSchema::Get().keys()) {
    EXPECT_NE(docs.find("`" + k.path + "`"), std::string::npos) << k.path;
  }
  for (const ConfigRefusal& r : ConfigRefusals()) {
    EXPECT_NE(docs.find("| `" + r.path + "` | " + r.when), std::string::npos) << r.path;
  }
}

}  // namespace
}  // namespace ztrain
