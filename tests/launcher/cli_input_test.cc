// A new user's mistakes at the command line (issue "a new user's machine and a new user's
// mistakes"): each is refused with a named error (exit 2, never a signal) before anything
// trains, and check-config refuses what train refuses; a model file alone sets the shape; a
// Hugging Face Trainer config with "auto"s trains.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/config.h"
#include "tests/launcher/cli_test_util.h"
#include "tests/read_only_dir.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A small model that trains in milliseconds.
json Small(const std::string& dir) {
  return {
      {"train_micro_batch_size_per_gpu", 4},
      {"steps_per_print", 1},
      {"model",
       {{"n_layer", 1}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 256}, {"max_seq_len", 16}}},
      {"training", {{"steps", 3}, {"eval_interval", 0}, {"output_dir", dir + "/out"}}}};
}

// Runs check-config and train on `j`: both must exit 2 naming every string of `want`.
void ExpectBothRefuse(const std::string& config, const std::vector<std::string>& want,
                      const std::string& what) {
  for (const std::string& command : {"check-config " + config, "--config " + config}) {
    const Result r = RunZtrain(command, "2>&1", kNoGpus);
    EXPECT_EQ(r.code, 2) << what << ": " << command << "\n" << r.out;
    for (const std::string& w : want) {
      EXPECT_NE(r.out.find(w), std::string::npos)
          << what << ": " << command << " lacks '" << w << "'\n"
          << r.out;
    }
    EXPECT_EQ(r.out.find("| loss"), std::string::npos) << what << ": it trained\n" << r.out;
  }
}

class CliInputTest : public CliTest {};

// It used to train to the end and then fail to write the weights, losing them.
TEST_F(CliInputTest, AnUnwritableSaveFinalFailsBeforeStepOne) {
  testing::ReadOnlyDir ro;
  if (!ro.ok()) GTEST_SKIP() << "cannot make a read-only directory here";
  json j = Small(dir_);
  j["training"]["steps"] = 100000;  // would take minutes if it trained
  j["training"]["save_final"] = ro.path() + "/model.bin";
  const auto start = std::chrono::steady_clock::now();
  ExpectBothRefuse(WriteConfig(j), {"training.save_final: cannot write in '" + ro.path() + "'"},
                   "read-only");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  // A missing directory is made at start, and the weights land there.
  j["training"]["steps"] = 3;
  j["training"]["save_final"] = dir_ + "/new/dir/model.bin";
  const Result r = RunZtrain("--config " + WriteConfig(j), "2>&1", kNoGpus);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir_ + "/new/dir/model.bin"));
}

TEST_F(CliInputTest, CheckConfigRefusesWhatTrainRefuses) {
  std::ofstream(dir_ + "/a_file") << "x";
  // A model file cut short (a copy that did not finish), named before anything trains.
  json save = Small(dir_);
  save["training"]["save_final"] = dir_ + "/whole.bin";
  ASSERT_EQ(RunZtrain("--config " + WriteConfig(save, "save.json"), "2>&1", kNoGpus).code, 0);
  fs::copy_file(dir_ + "/whole.bin", dir_ + "/cut.bin");
  fs::resize_file(dir_ + "/cut.bin", 3000);
  struct Case {
    const char* what;
    json patch;  // merged into Small()
    std::vector<std::string> want;
  };
  const Case cases[] = {
      {"aio size",
       {{"aio", {{"block_size", 1000}}}},
       {"aio.block_size: must be a multiple of 4096"}},
      {"aio depth", {{"aio", {{"queue_depth", 4294967297}}}}, {"aio.queue_depth: must be at most"}},
      {"empty target_modules",
       {{"lora", {{"r", 4}, {"target_modules", ""}}}},
       {"lora.target_modules: \"\" is an empty regular expression"}},
      {"checkpoint.dir a file",
       {{"checkpoint", {{"dir", dir_ + "/a_file"}}}},
       {"checkpoint.dir: '" + dir_ + "/a_file' is a regular file"}},
      {"missing data",
       {{"data", {{"train", dir_ + "/none_*.bin"}}}},
       {"data.train:", "none_*.bin"}},
      {"missing init_from",
       {{"model", {{"init_from", dir_ + "/none.bin"}}}},
       {"model.init_from:", "none.bin"}},
      {"missing nvme_path",
       {{"zero_optimization",
         {{"stage", 3}, {"offload_param", {{"device", "nvme"}, {"nvme_path", dir_ + "/nvme"}}}}}},
       {"zero_optimization.offload_param.nvme_path:", "is not a directory"}},
      {"micro-batch of 2^62",
       {{"train_micro_batch_size_per_gpu", int64_t{1} << 62}},
       {"train_micro_batch_size_per_gpu 4611686018427387904", "Note [Size limits]"}},
      {"width past int", {{"model", {{"n_embd", int64_t{1} << 32}}}}, {"model.n_embd: must be <="}},
      {"truncated init_from",
       {{"model", {{"init_from", dir_ + "/cut.bin"}}}},
       {"model.init_from:", "cut.bin' is 3000 bytes but its header describes", "truncated"}},
  };
  for (const Case& c : cases) {
    json j = Small(dir_);
    j.merge_patch(c.patch);
    ExpectBothRefuse(WriteConfig(j), c.want, c.what);
  }
  // A directory given as the config file is named as one.
  ExpectBothRefuse(dir_, {"is a directory; give the JSON config file"}, "a directory");
}

// `"model": {"init_from": FILE}` alone is a whole model: the shape comes from the file's
// header; a shape key that disagrees names both values.
TEST_F(CliInputTest, AModelFileAloneSetsTheShape) {
  json j = Small(dir_);
  j["model"]["max_seq_len"] = 24;
  j["training"]["save_final"] = dir_ + "/start.bin";
  ASSERT_EQ(RunZtrain("--config " + WriteConfig(j), "2>&1", kNoGpus).code, 0);
  const json alone = {{"train_micro_batch_size_per_gpu", 2},
                      {"model", {{"init_from", dir_ + "/start.bin"}}},
                      {"training", {{"steps", 2}, {"eval_interval", 0}, {"output_dir", dir_}}}};
  const Result r = RunZtrain("--config " + WriteConfig(alone, "alone.json"), "2>&1", kNoGpus);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("config: model = {"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"max_seq_len\":24"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("loaded weights from"), std::string::npos) << r.out;
  json wrong = alone;
  wrong["model"]["max_seq_len"] = 1024;
  ExpectBothRefuse(WriteConfig(wrong, "wrong.json"),
                   {"model.max_seq_len: the config says 1024 but model.init_from", "has 24"},
                   "a disagreeing shape");
}

// A config written for the HF Trainer ("auto" for the batch, optimizer, scheduler, precision
// and buckets) trains, logging each value chosen with its reason.
TEST_F(CliInputTest, AHuggingFaceTrainerConfigTrains) {
  json j = Small(dir_);
  j.erase("train_micro_batch_size_per_gpu");
  j.merge_patch(json::parse(R"({
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW",
                  "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR",
                  "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                             "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})"));
  const Result r = RunZtrain("--config " + WriteConfig(j), "2>&1", kNoGpus);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* line :
       {"config: train_micro_batch_size_per_gpu = ", "as ztrain tune finds it",
        "config: optimizer.params.lr = 5e-05 (the HF Trainer's default learning_rate)",
        "config: zero_optimization.reduce_bucket_size = 1024 (model.n_embd^2",
        "config: bf16.enabled = "}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
  const Result check = RunZtrain("check-config " + WriteConfig(j), "2>&1", kNoGpus);
  EXPECT_EQ(check.code, 0) << check.out;
  EXPECT_NE(
      check.out.find("auto: gradient_clipping = 1.0 (the HF Trainer's default max_grad_norm)"),
      std::string::npos)
      << check.out;
}

// Problems in a user's own files are named in that file's words: a Hugging Face config.json
// value by its file and HF key (num_attention_heads, not model.n_head), a truncated or
// invalid JSON file by line and column, a binary file as binary.
TEST_F(CliInputTest, ProblemsInUsersFilesAreNamedInTheirWords) {
  const std::string model = dir_ + "/model";
  fs::create_directories(model);
  json hf = {{"architectures", {"LlamaForCausalLM"}},
             {"model_type", "llama"},
             {"hidden_size", 64},
             {"num_attention_heads", 0},
             {"num_hidden_layers", 2},
             {"intermediate_size", 128},
             {"vocab_size", 256},
             {"max_position_embeddings", 64}};
  std::ofstream(model + "/config.json") << hf.dump();
  json j = Small(dir_);
  j.erase("model");
  j["model"] = {{"init_from", model}};
  const std::string config = WriteConfig(j);
  const Result heads = RunZtrain("check-config " + config);
  EXPECT_EQ(heads.code, 2) << heads.out;
  EXPECT_NE(heads.out.find(model + "/config.json: num_attention_heads must be >= 1, got 0"),
            std::string::npos)
      << heads.out;
  std::ofstream(model + "/config.json") << hf.dump().substr(0, 40);
  const Result cut = RunZtrain("check-config " + config);
  EXPECT_EQ(cut.code, 2) << cut.out;
  EXPECT_NE(cut.out.find(model + "/config.json':1:"), std::string::npos) << cut.out;
  EXPECT_NE(cut.out.find("truncated?"), std::string::npos) << cut.out;
  const Result binary = RunZtrain("check-config " + std::string(ZTRAIN_BINARY));
  EXPECT_EQ(binary.code, 2) << binary.out;
  EXPECT_NE(binary.out.find("is a binary file, not JSON"), std::string::npos) << binary.out;
  std::ofstream(dir_ + "/t.txt") << "text";
  std::ofstream(model + "/tokenizer.json") << "{\"model\": {\"type\": \"BPE\", \"vocab\": {";
  const Result tok =
      RunZtrain("data " + dir_ + "/t.txt --tokenizer " + model + " --out " + dir_ + "/t.bin");
  EXPECT_NE(tok.code, 0) << tok.out;
  EXPECT_NE(tok.out.find("tokenizer " + model + "/tokenizer.json:1:"), std::string::npos)
      << tok.out;
  EXPECT_NE(tok.out.find("truncated?"), std::string::npos) << tok.out;
}

// A number or size out of range at the command line is answered with the range in words,
// not CLI11's "Value 0 not in range 0.000000 to 1797693134862315708..." nor a bare "is not a
// size".
TEST_F(CliInputTest, NumbersAndSizesOutOfRangeAreSaidInWords) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"estimate --config x.json --world-size 0", "--world-size: must be above 0, got 0"},
      {"generate --model x --top-p 2", "--top-p: must be between 0 and 1, got 2"},
      {"generate --model x --temperature -1", "--temperature: must be 0 or more, got -1"},
      {"generate --model x --top-k many", "'many' is not a number"},
      {"export --checkpoint x --format hf --out y --max-shard-size 5XB",
       "--max-shard-size \"5XB\" is not a size: a size is a number above 0 and a unit"},
      {"export --checkpoint x --format hf --out y --max-shard-size 1PiB",
       "e.g. 16GiB, 512MiB, 5GB or 4096"}};
  for (const auto& [args, want] : cases) {
    const Result r = RunZtrain(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << args << "\n" << r.out;
    EXPECT_EQ(r.out.find("179769313486"), std::string::npos) << args << "\n" << r.out;
  }
}

// Weights with a NaN are named by file and tensor (not blamed on the learning rate later);
// generate on a checkpoint directory names --checkpoint; a prompt that fills the context is
// refused and more new tokens than the context holds are capped with a warning, before
// anything prints; --decode of a shard with ids beyond the byte tokens names --tokenizer.
TEST_F(CliInputTest, BrokenWeightsAndMisplacedInputsAreNamed) {
  json j = Small(dir_);
  j["training"]["save_final"] = dir_ + "/m.bin";
  j["checkpoint"] = {{"dir", dir_ + "/ckpt"}};
  ASSERT_EQ(RunZtrain("--config " + WriteConfig(j), "2>&1", kNoGpus).code, 0);
  {
    std::fstream f(dir_ + "/m.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1024 + 4 * 10);
    const float nan = std::nanf("");
    f.write(reinterpret_cast<const char*>(&nan), sizeof nan);
  }
  json from = Small(dir_);
  from["model"] = {{"init_from", dir_ + "/m.bin"}};
  const Result nan = RunZtrain("--config " + WriteConfig(from, "from.json"), "2>&1", kNoGpus);
  EXPECT_NE(nan.code, 0) << nan.out;
  EXPECT_NE(nan.out.find(dir_ + "/m.bin: tensor '"), std::string::npos) << nan.out;
  EXPECT_NE(nan.out.find("holds NaN at element 10"), std::string::npos) << nan.out;
  EXPECT_EQ(nan.out.find("| loss"), std::string::npos) << "it trained\n" << nan.out;
  const Result ckpt = RunZtrain("generate --model " + dir_ + "/ckpt --prompt-ids 1");
  EXPECT_EQ(ckpt.code, 2) << ckpt.out;
  EXPECT_NE(ckpt.out.find("give it as --checkpoint " + dir_ + "/ckpt"), std::string::npos)
      << ckpt.out;
  std::string ids = "1";
  for (int i = 0; i < 16; ++i) ids += ",2";
  const Result full =
      RunZtrain("generate --checkpoint " + dir_ + "/ckpt --ids --prompt-ids " + ids);
  EXPECT_EQ(full.code, 2) << full.out;
  EXPECT_NE(full.out.find("fills the model's context of 16"), std::string::npos) << full.out;
  const Result capped = RunZtrain("generate --checkpoint " + dir_ +
                                  "/ckpt --ids --prompt-ids 1,2 --max-new-tokens 100");
  EXPECT_EQ(capped.code, 0) << capped.out;
  EXPECT_NE(capped.out.find("generating at most 14 tokens"), std::string::npos) << capped.out;
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = 2;
  const uint16_t tokens[2] = {300, 5};
  {
    std::ofstream f(dir_ + "/gpt2.bin", std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
    f.write(reinterpret_cast<const char*>(tokens), sizeof tokens);
  }
  const Result bytes = RunZtrain("data --decode " + dir_ + "/gpt2.bin --out " + dir_ + "/g.txt");
  EXPECT_EQ(bytes.code, 2) << bytes.out;
  EXPECT_NE(bytes.out.find("holds token id 300 at position 0"), std::string::npos) << bytes.out;
  EXPECT_NE(bytes.out.find("no --tokenizer was given"), std::string::npos) << bytes.out;
  EXPECT_FALSE(fs::exists(dir_ + "/g.txt"));
}

// Legitimate but surely unintended LoRA setups train, with a warning saying why: QLoRA over a
// random base (no model.init_from), lora.r above what an adapted layer can hold, and an
// llm_int8_skip_modules entry that matches nothing (named; the one that matches is not).
TEST_F(CliInputTest, UnlikelyAdapterSetupsAreWarnedAbout) {
  json j = Small(dir_);
  j["training"]["steps"] = 1;
  j["lora"] = {{"r", 64}, {"target_modules", "all-linear"}};
  j["quantization"] = {{"load_in_4bit", true},
                       {"bnb_4bit_quant_type", "nf4"},
                       {"llm_int8_skip_modules", {"c_fc", "no_such"}}};
  const Result r = RunZtrain("--config " + WriteConfig(j), "2>&1", kNoGpus);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("quantization (nf4) over a randomly initialised base"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("lora.r 64 is above the smaller side of 4 adapted layers"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("llm_int8_skip_modules: 'no_such' matched no linear"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("'c_fc' matched no linear"), std::string::npos) << r.out;
}

// An explicit --resume means resume: a mistyped checkpoint.dir (no checkpoint there) is
// refused, not a silent start from step 0; a resume at training.steps says that no step is
// left instead of "done: 0 steps ... loss 0.0000"; --prompt with --prompt-ids is refused.
// What check-config prints is a config that check-config accepts and resolves the same way.
TEST_F(CliInputTest, CheckConfigsOutputIsAConfigItAccepts) {
  json j = Small(dir_);
  j["model"]["type"] = "llama";
  const Result first = RunZtrain("check-config " + WriteConfig(j), "2>/dev/null", kNoGpus);
  ASSERT_EQ(first.code, 0) << first.out;
  const json resolved = json::parse(first.out);
  EXPECT_EQ(resolved["model"]["n_kv_head"], "auto");
  const Result again =
      RunZtrain("check-config " + WriteConfig(resolved, "resolved.json"), "2>/dev/null", kNoGpus);
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_EQ(json::parse(again.out), resolved);
  json zero = j;
  zero["model"]["n_kv_head"] = 0;
  const Result refused = RunZtrain("check-config " + WriteConfig(zero, "zero.json"), "2>&1", kNoGpus);
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_NE(refused.out.find("model.n_kv_head: must be >= 1, got 0"), std::string::npos)
      << refused.out;
}

TEST_F(CliInputTest, AResumeWithoutACheckpointOrStepsLeftSaysSo) {
  json j = Small(dir_);
  j["checkpoint"] = {{"dir", dir_ + "/ckpt"}};
  ASSERT_EQ(RunZtrain("--config " + WriteConfig(j), "2>&1", kNoGpus).code, 0);
  json typo = j;
  typo["checkpoint"]["dir"] = dir_ + "/ckpy";
  const Result none = RunZtrain("--config " + WriteConfig(typo, "typo.json") + " --resume",
                                "2>&1", kNoGpus);
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find("holds no checkpoint"), std::string::npos) << none.out;
  EXPECT_EQ(none.out.find("| loss"), std::string::npos) << "it trained\n" << none.out;
  // check-config says the same before the run, and what checkpoint.resume will do.
  const Result check_none =
      RunZtrain("check-config " + WriteConfig(typo, "typo.json") + " --resume", "2>&1", kNoGpus);
  EXPECT_EQ(check_none.code, 2) << check_none.out;
  EXPECT_NE(check_none.out.find("holds no checkpoint"), std::string::npos) << check_none.out;
  typo["checkpoint"]["resume"] = true;
  const Result check_auto =
      RunZtrain("check-config " + WriteConfig(typo, "typo.json"), "2>&1", kNoGpus);
  EXPECT_EQ(check_auto.code, 0) << check_auto.out;
  EXPECT_NE(check_auto.out.find("holds no checkpoint yet: checkpoint.resume starts this run "
                                "from step 0"),
            std::string::npos)
      << check_auto.out;
  const Result check_found =
      RunZtrain("check-config " + WriteConfig(j) + " --resume", "2>&1", kNoGpus);
  EXPECT_EQ(check_found.code, 0) << check_found.out;
  EXPECT_NE(check_found.out.find("resume: from " + dir_ + "/ckpt/step3"), std::string::npos)
      << check_found.out;
  const Result done = RunZtrain("--config " + WriteConfig(j) + " --resume", "2>&1", kNoGpus);
  EXPECT_EQ(done.code, 0) << done.out;
  EXPECT_NE(done.out.find("no step is left to train"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("done: no step taken (at step 3 of training.steps 3)"),
            std::string::npos)
      << done.out;
  EXPECT_EQ(done.out.find("loss 0.0000"), std::string::npos) << done.out;
  const Result both = RunZtrain("generate --model " + dir_ + " --prompt a --prompt-ids 1,2");
  EXPECT_EQ(both.code, 2) << both.out;
  EXPECT_NE(both.out.find("excludes"), std::string::npos) << both.out;
}

// `ztrain data` writes over nothing it reads nor an earlier corpus unless asked: --decode
// onto its own shard, shards or their text into the tokenizer's directory or onto its file,
// a second corpus onto the first; each is refused (exit 2) and the files are left as they
// were. With --overwrite the earlier corpus is replaced.
TEST_F(CliInputTest, DataWritesOverNeitherItsInputsNorAnEarlierCorpus) {
  const std::string text = dir_ + "/book.txt";
  std::ofstream(text) << "Call me Ishmael. Some years ago...\n";
  const std::string shard = dir_ + "/book.bin";
  ASSERT_EQ(RunZtrain("data " + text + " --out " + shard).code, 0);
  const auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string shard_bytes = bytes(shard);
  ASSERT_FALSE(shard_bytes.empty());
  const auto refused = [&](const std::string& args, const std::string& want) {
    const Result r = RunZtrain(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << args << "\n" << r.out;
  };
  refused("data --decode " + shard + " --out " + shard, "is the shard --decode reads");
  EXPECT_EQ(bytes(shard), shard_bytes) << "--decode emptied its own shard";
  const std::string tok = dir_ + "/tok";
  fs::create_directories(tok);
  std::ofstream(tok + "/tokenizer.json") << "{\"model\": {}}";
  const std::string tok_bytes = bytes(tok + "/tokenizer.json");
  refused("data " + text + " --tokenizer " + tok + " --out " + tok + "/tokenizer.json",
          "lies inside --tokenizer");
  refused("data " + text + " --tokenizer " + tok + "/tokenizer.json --out " + tok +
              "/tokenizer.json",
          "is --tokenizer");
  refused("data --decode " + shard + " --tokenizer " + tok + " --out " + tok + "/tokenizer.json",
          "lies inside --tokenizer");
  EXPECT_EQ(bytes(tok + "/tokenizer.json"), tok_bytes) << "the tokenizer was overwritten";
  refused("data " + text + " --out " + shard, "is there from an earlier run");
  const std::string decoded = dir_ + "/book.txt.out";
  ASSERT_EQ(RunZtrain("data --decode " + shard + " --out " + decoded).code, 0);
  refused("data --decode " + shard + " --out " + decoded, "already holds a file");
  std::ofstream(text, std::ios::app) << "More text.\n";
  const Result again = RunZtrain("data " + text + " --out " + shard + " --overwrite");
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_GT(bytes(shard).size(), shard_bytes.size()) << "--overwrite did not replace the corpus";
}

// Never overwrite an input: `ztrain data --out` onto its --text, and `ztrain export --out`
// into the checkpoint it reads, are refused, and the input is left byte for byte.
TEST_F(CliInputTest, DataAndExportNeverOverwriteTheirInput) {
  const std::string text = dir_ + "/book.txt";
  std::ofstream(text) << "Call me Ishmael. Some years ago...\n";
  const Result data = RunZtrain("data --text " + text + " --out " + text);
  EXPECT_EQ(data.code, 2) << data.out;
  EXPECT_NE(data.out.find("would write over the input"), std::string::npos) << data.out;
  std::ifstream in(text);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}),
            "Call me Ishmael. Some years ago...\n");
  const Result to_dir = RunZtrain("data --text " + text + " --out " + dir_);
  EXPECT_EQ(to_dir.code, 2) << to_dir.out;
  EXPECT_NE(to_dir.out.find("is a directory; give the shard a file name"), std::string::npos)
      << to_dir.out;

  json j = Small(dir_);
  j["checkpoint"] = {{"dir", dir_ + "/ckpt"}};
  ASSERT_EQ(RunZtrain("--config " + WriteConfig(j), "2>&1", kNoGpus).code, 0);
  for (const std::string& out : {dir_ + "/ckpt/step3/rank0.bin", dir_ + "/ckpt/model.bin"}) {
    const Result r = RunZtrain("export --checkpoint " + dir_ + "/ckpt --format llmc --out " + out);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("is inside the checkpoint directory"), std::string::npos) << r.out;
  }
  const Result resumed = RunZtrain("--config " + WriteConfig(j) + " --resume", "2>&1", kNoGpus);
  EXPECT_EQ(resumed.code, 0) << resumed.out;  // the checkpoint is intact
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  EXPECT_EQ(
      RunZtrain("export --checkpoint " + dir_ + "/ckpt --format llmc --out " + dir_ + "/m.bin")
          .code,
      0);
}

}  // namespace
}  // namespace ztrain
