// Note [Preflight] (run/preflight.h): every path a run writes is checked before it trains
// (a run makes its output directories, check-config makes nothing), the data is opened and
// checked, and the Trainer refuses a run whose final weights could not be saved before step 1.
#include "run/preflight.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "data/token_shard.h"
#include "run/trainer.h"
#include "tests/data/data_test_util.h"
#include "tests/engine/test_model.h"
#include "tests/expect_error.h"
#include "tests/read_only_dir.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ExpectErrorWith;

Config WithPaths(const std::string& dir, const json& training) {
  json j = testing::TinyConfigJson();
  j["training"]["output_dir"] = dir + "/out";
  for (const auto& [k, v] : training.items()) j["training"][k] = v;
  return ParseConfig(j);
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}

TEST(PreflightTest, MissingOutputDirectoriesAreMadeByARunAndLeftByACheck) {
  data::test_util::TempDir dir;
  json j = testing::TinyConfigJson();
  j["training"]["save_final"] = dir.File("a/b/model.bin");
  j["training"]["output_dir"] = dir.File("reports");
  j["checkpoint"] = {{"dir", dir.File("ckpt/run1")}};
  j["csv_monitor"] = {{"enabled", true}, {"output_path", dir.File("csv")}, {"job_name", "j"}};
  const Config c = ParseConfig(j);
  EXPECT_TRUE(PreflightProblems(c, {.create_outputs = false}).empty());
  EXPECT_FALSE(fs::exists(dir.File("a")));  // a check makes nothing
  EXPECT_TRUE(PreflightProblems(c, {.create_outputs = true}).empty());
  for (const char* made : {"a/b", "reports", "ckpt/run1", "csv/j"}) {
    EXPECT_TRUE(fs::is_directory(dir.File(made))) << made;
  }
  // No probe file is left behind.
  for (const auto& e : fs::recursive_directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".ztrain-probe"), std::string::npos) << e.path();
  }
}

TEST(PreflightTest, EveryUnwritableOutputIsNamedWithItsFix) {
  data::test_util::TempDir dir;
  std::ofstream(dir.File("file")) << "not a directory";
  json j = testing::TinyConfigJson();
  j["training"]["save_final"] = dir.File("file") + "/";    // a HF directory below a file
  j["training"]["output_dir"] = dir.File("file/reports");  // below a regular file
  j["checkpoint"] = {{"dir", dir.File("file")}};           // a regular file
  j["zero_optimization"] = {
      {"stage", 2},
      {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", dir.File("no_such_dir")}}}};
  const std::string all = Joined(PreflightProblems(ParseConfig(j), {}));
  for (const char* want :
       {"training.save_final: '", "file' is a regular file, not a directory, so '",
        "training.output_dir: '",
        "file' is a regular file, not a directory, so '", "checkpoint.dir: '",
        "zero_optimization.offload_optimizer.nvme_path: '",
        "is not a directory; create it or point nvme_path at a local NVMe mount"}) {
    EXPECT_NE(all.find(want), std::string::npos) << want << "\n" << all;
  }
  EXPECT_THROW(Preflight(ParseConfig(j), {}), ConfigError);
  // An existing directory is a Hugging Face directory to write (nn/hf_checkpoint.h), which
  // replaces it whole: one that holds a model's files (an earlier save), or nothing, is fine;
  // one that holds other files is refused, naming them.
  std::filesystem::create_directories(dir.File("model"));
  std::ofstream(dir.File("model/config.json")) << "{}";
  std::ofstream(dir.File("model/model.safetensors")) << "x";
  // Another rank's write probe, there for a moment, is no file of the user's (a 4-rank
  // resume failed on one, once in a few runs).
  std::ofstream(dir.File("model/.ztrain-probe-a1b2c3")) << "";
  j["training"]["save_final"] = dir.File("model");
  EXPECT_EQ(Joined(PreflightProblems(ParseConfig(j), {})).find("training.save_final"),
            std::string::npos);
  std::filesystem::create_directories(dir.File("model/.git"));  // a cloned Hugging Face repo
  EXPECT_NE(Joined(PreflightProblems(ParseConfig(j), {})).find("holds .git/, which are not"),
            std::string::npos);
  std::filesystem::remove_all(dir.File("model/.git"));
  j["training"]["save_final"] = dir.path();
  const std::string other = Joined(PreflightProblems(ParseConfig(j), {}));
  EXPECT_NE(other.find("training.save_final: '" + dir.path() + "' holds file, model/, which "
                       "are not a model's files"),
            std::string::npos)
      << other;
  // Nor may the run write anything else inside it first: the save would delete it.
  j = testing::TinyConfigJson();
  j["training"]["save_final"] = dir.File("final/");
  j["training"]["output_dir"] = dir.File("final/run");
  j["checkpoint"] = {{"dir", dir.File("final/../final/ckpt")}};
  const std::string inside = Joined(PreflightProblems(ParseConfig(j), {}));
  for (const char* key : {"training.output_dir '", "checkpoint.dir '"}) {
    EXPECT_NE(inside.find("training.save_final: '" + dir.File("final/") + "' holds " + key),
              std::string::npos)
        << inside;
  }
  j["training"]["output_dir"] = dir.File("finalrun");  // beside it, with a common prefix
  j["checkpoint"] = {{"dir", dir.File("final_ckpt")}};
  EXPECT_EQ(Joined(PreflightProblems(ParseConfig(j), {})).find("training.save_final"),
            std::string::npos);
}

// An llm.c model file holds GPT-2 only: a Llama run's save_final must name a directory, and
// is refused before training rather than after it. A LoRA run's is its adapter directory.
TEST(PreflightTest, AModelFileForALlamaIsRefusedUpFront) {
  data::test_util::TempDir dir;
  json j = testing::TinyLlamaConfigJson();
  j["training"]["save_final"] = dir.File("base");
  const std::string all = Joined(PreflightProblems(ParseConfig(j), {}));
  for (const char* want : {"training.save_final: '", "llm.c model file", "model.type is llama",
                           "end the path with '/'"}) {
    EXPECT_NE(all.find(want), std::string::npos) << want << "\n" << all;
  }
  j["training"]["save_final"] = dir.File("base") + "/";
  EXPECT_EQ(Joined(PreflightProblems(ParseConfig(j), {})).find("training.save_final"),
            std::string::npos);
  j["training"]["save_final"] = dir.File("adapter");
  j["lora"] = {{"r", 2}};
  EXPECT_TRUE(PreflightProblems(ParseConfig(j), {.create_outputs = true}).empty());
  EXPECT_TRUE(fs::is_directory(dir.File("adapter")));
}

TEST(PreflightTest, AReadOnlyDirectoryIsRefused) {
  testing::ReadOnlyDir ro;
  if (!ro.ok()) GTEST_SKIP() << "cannot make a read-only directory here";
  data::test_util::TempDir dir;
  const std::string all = Joined(PreflightProblems(
      WithPaths(dir.path(), {{"save_final", ro.path() + "/model.bin"}}), {.create_outputs = true}));
  EXPECT_NE(all.find("training.save_final: cannot write in '" + ro.path() + "'"), std::string::npos)
      << all;
  EXPECT_NE(all.find("point training.save_final at a directory this job can write"),
            std::string::npos)
      << all;
  // A directory still to be made below it is refused too, and not made.
  const std::string below = Joined(PreflightProblems(
      WithPaths(dir.path(), {{"output_dir", ro.path() + "/x/y"}}), {.create_outputs = true}));
  EXPECT_NE(below.find("training.output_dir: cannot create '" + ro.path() + "/x/y'"),
            std::string::npos)
      << below;
}

TEST(PreflightTest, TheFinalModelMayNotOverwriteTheWeightsTheRunStartsFrom) {
  data::test_util::TempDir dir;
  std::ofstream(dir.File("start.bin")) << "weights";
  json j = testing::TinyConfigJson();
  j["model"]["init_from"] = dir.File("start.bin");
  j["training"]["save_final"] = dir.path() + "/./start.bin";
  const std::string all = Joined(PreflightProblems(ParseConfig(j), {}));
  EXPECT_NE(all.find("is model.init_from, the weights this run starts from"), std::string::npos)
      << all;
}

TEST(PreflightTest, TheDataIsOpenedAndChecked) {
  data::test_util::TempDir dir;
  std::vector<uint16_t> tokens(100, 3);
  tokens[77] = 40;  // outside TinyConfigJson's vocabulary of 11
  data::WriteTokenShard(dir.File("bad.bin"), tokens, data::TokenFormat::kUint16);
  json j = testing::TinyConfigJson();
  j["data"]["train"] = dir.File("bad.bin");
  j["data"]["val"] = dir.File("none_*.bin");
  const std::string all = Joined(PreflightProblems(ParseConfig(j), {.open_data = true}));
  EXPECT_NE(all.find("data.train: token 40 at index 77"), std::string::npos) << all;
  EXPECT_NE(all.find("data.val: "), std::string::npos) << all;
  EXPECT_NE(all.find("none_*.bin"), std::string::npos) << all;
  EXPECT_TRUE(PreflightProblems(ParseConfig(j), {.open_data = false}).empty());
  // Packed documents over shards without a manifest: check-config says which keys to give.
  tokens[77] = 3;
  data::WriteTokenShard(dir.File("good.bin"), tokens, data::TokenFormat::kUint16);
  j["data"] = {{"train", dir.File("good.bin")}, {"packed_documents", true}, {"seq_len", 8}};
  const std::string packed = Joined(PreflightProblems(ParseConfig(j), {.open_data = true}));
  EXPECT_NE(packed.find("no corpus manifest"), std::string::npos) << packed;
  EXPECT_NE(packed.find("data.document_start_token"), std::string::npos) << packed;
  j["data"]["document_start_token"] = 3;
  EXPECT_TRUE(PreflightProblems(ParseConfig(j), {.open_data = true}).empty());
}

// The run used to train to its end and then fail to save, losing the weights: now the Trainer
// refuses it before building anything.
TEST(PreflightTest, TheTrainerRefusesAnUnsavableRunBeforeTraining) {
  testing::ReadOnlyDir ro;
  if (!ro.ok()) GTEST_SKIP() << "cannot make a read-only directory here";
  data::test_util::TempDir dir;
  const Config c = WithPaths(dir.path(), {{"save_final", ro.path() + "/model.bin"}, {"steps", 5}});
  ExpectErrorWith<ConfigError>([&] { Trainer t(c); }, {"training.save_final: cannot write"});
  EXPECT_FALSE(fs::exists(dir.File("out/memory_rank0.json")));  // it never ran
}

}  // namespace
}  // namespace ztrain
