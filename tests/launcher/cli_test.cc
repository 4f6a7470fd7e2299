// The ztrain executable end to end: version, check-config, the device choice, data, a training
// run whose loss falls far below ln(vocab) with its csv_monitor file, save_final, and a clean
// stop on Ctrl-C.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/config.h"
#include "core/memory_tracker.h"
#include "data/token_shard.h"
#include "nn/gpt2.h"
#include "nn/llmc_model_file.h"
#include "tests/launcher/cli_test_util.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;

TEST_F(CliTest, VersionNamesTheBackends) {
  const Result r = RunZtrain("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("ztrain 0."), std::string::npos) << r.out;
  for (const char* b : {"CPU", "CUDA", "NCCL", "MPI", "io_uring"})
    EXPECT_NE(r.out.find(b), std::string::npos) << b;
}

TEST_F(CliTest, CheckConfigPrintsResolvedConfigOrErrors) {
  nlohmann::json j = DefaultConfigJson();
  const std::string err = dir_ + "/stderr.txt";
  Result ok = RunZtrain("check-config " + WriteConfig(j), "2>" + err, kNoGpus);
  ASSERT_EQ(ok.code, 0) << ok.out;
  const nlohmann::json resolved = nlohmann::json::parse(ok.out);  // stdout is the JSON alone
  EXPECT_EQ(resolved["train_batch_size"], j["train_micro_batch_size_per_gpu"]);
  EXPECT_EQ(resolved["device"], "auto");
  // stderr names each "auto" the config wrote with its value and reason, then where the
  // device setting puts a process on this machine.
  ASSERT_EQ(Lines(err).size(), 3u);
  EXPECT_EQ(Lines(err)[0],
            "auto: model.padded_vocab_size = 512 (model.vocab_size rounded up to a multiple of "
            "128)");
  EXPECT_EQ(Lines(err)[1], "auto: data.seq_len = 64 (model.max_seq_len)");
  EXPECT_EQ(Lines(err)[2], "device on this machine: cpu (no CUDA device visible)");
  j["device"] = "cuda";  // valid, but not here: said, not an error
  EXPECT_EQ(RunZtrain("check-config " + WriteConfig(j), "2>" + err, kNoGpus).code, 0);
  EXPECT_NE(Lines(err).back().find("device on this machine: not usable here: device is \"cuda\""),
            std::string::npos)
      << Lines(err).back();
  j["device"] = "tpu";
  const Result tpu = RunZtrain("check-config " + WriteConfig(j));
  EXPECT_EQ(tpu.code, 2);
  EXPECT_NE(tpu.out.find("device: expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\""),
            std::string::npos)
      << tpu.out;
  j.erase("device");
  j["zero_optimization"] = {{"stage", 0}, {"reduce_bucket_sise", 100}};
  const Result bad = RunZtrain("check-config " + WriteConfig(j));
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("zero_optimization.reduce_bucket_sise"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("reduce_bucket_size"), std::string::npos) << bad.out;
  EXPECT_EQ(RunZtrain("check-config " + dir_ + "/missing.json").code, 2);
  EXPECT_EQ(RunZtrain("--config " + WriteConfig(j)).code, 2);  // train refuses it too
}

// `ztrain estimate`: every category per rank, the table of stages and offload choices, a
// model given by size; bad input exits 2 with the reason.
TEST_F(CliTest, EstimateReportsEveryCategoryOrRefusesBadInput) {
  nlohmann::json j = DefaultConfigJson();
  const Result r = RunZtrain("estimate --config " + WriteConfig(j) + " --gpus-per-node 4");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* word : {"parameters", "gradients", "optimizer_state", "activations",
                           "communication", "swap_buffers", "workspace", "total", "NVMe",
                           "ZeRO stage 0", "optimizer+param cpu", "host/node"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word << "\n" << r.out;
  }
  // Stage 0 on one rank holds every layer's flat fp32 buffer: the parameters' line says so.
  const Config cfg = ParseConfig(j);
  int64_t padded = 0;
  for (const auto& layer : nn::BuildGpt2(cfg.model)) {
    int64_t n = 0;
    for (const nn::ParamSpec& s : layer->Params()) {
      if (s.tied_to.empty()) n = (n + NumElements(s.shape) + 15) / 16 * 16;
    }
    padded += n;
  }
  const std::string line = "  parameters ";
  const size_t at = r.out.find(line);
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string params_line = r.out.substr(at, r.out.find('\n', at) - at);
  EXPECT_NE(params_line.find(FormatBytes(4 * padded)), std::string::npos) << params_line;

  const Result sized =
      RunZtrain("estimate --params 1.5B --layers 48 --hidden 1600 --heads 25 --world-size 8");
  ASSERT_EQ(sized.code, 0) << sized.out;
  EXPECT_NE(sized.out.find("48 blocks, n_embd 1600, 25 heads"), std::string::npos) << sized.out;
  EXPECT_NE(sized.out.find("dp 8 x pp 1 x tp 1"), std::string::npos) << sized.out;

  const Result nothing = RunZtrain("estimate");
  EXPECT_EQ(nothing.code, 2);
  EXPECT_NE(nothing.out.find("--config FILE or a model size"), std::string::npos) << nothing.out;
  const Result bad_size = RunZtrain("estimate --params 7X --layers 2 --hidden 64");
  EXPECT_EQ(bad_size.code, 2);
  EXPECT_NE(bad_size.out.find("--params '7X' is not a count"), std::string::npos) << bad_size.out;
  const Result no_shape = RunZtrain("estimate --params 7B");
  EXPECT_EQ(no_shape.code, 2);
  EXPECT_NE(no_shape.out.find("--layers and --hidden"), std::string::npos) << no_shape.out;
  EXPECT_EQ(RunZtrain("estimate --config " + dir_ + "/missing.json").code, 2);
  EXPECT_EQ(RunZtrain("estimate --config " + WriteConfig(j) + " --world-size 0").code, 2);
}

// "1.23 GiB" -> bytes (FormatBytes's output, to its rounding).
double ParseFormatted(const std::string& text) {
  std::istringstream in(text);
  double value = 0;
  std::string unit;
  in >> value >> unit;
  const std::vector<std::string> units = {"B", "KiB", "MiB", "GiB", "TiB"};
  for (size_t i = 0; i < units.size(); ++i) {
    if (unit == units[i]) return value * static_cast<double>(int64_t{1} << (10 * i));
  }
  ADD_FAILURE() << "not a size: " << text;
  return 0;
}

// The line of `out` that starts with `prefix` after the line containing `after`.
std::string LineAfter(const std::string& out, const std::string& after,
                      const std::string& prefix) {
  const size_t start = out.find(after);
  if (start == std::string::npos) return "";
  const size_t at = out.find("\n" + prefix, start);
  if (at == std::string::npos) return "";
  return out.substr(at + 1, out.find('\n', at + 1) - at - 1);
}

// `ztrain estimate --gpu-memory`: the nodes each stage and offload choice needs (Note [Nodes
// needed]). For a 7B model on 8 x 40 GiB nodes, the count printed for a row is the fewest
// whose GPU peak fits: the estimate for that many nodes prints the same peak for the row,
// within 40 GiB, and one node fewer is over it. Stage 0 keeps whole replicas and fits on no
// number of nodes.
TEST_F(CliTest, EstimateFindsTheNodesEachChoiceNeeds) {
  const std::string model = "estimate --params 7B --layers 32 --hidden 4096 --gpus-per-node 8";
  const Result r = RunZtrain(model + " --world-size 8 --gpu-memory 40GiB --max-nodes 64");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string table = "nodes of 8 GPUs with 40.00 GiB each";
  ASSERT_NE(r.out.find(table), std::string::npos) << r.out;
  EXPECT_NE(LineAfter(r.out, table, "  0     none").find("over 64"), std::string::npos) << r.out;
  int checked = 0;
  for (const char* row : {"  1     none", "  2     none", "  3     none"}) {
    const std::string line = LineAfter(r.out, table, row);
    ASSERT_FALSE(line.empty()) << row << "\n" << r.out;
    int nodes = 0;
    char peak[32] = {};
    if (std::sscanf(line.c_str() + std::string(row).size(), " %d (%31[^)])", &nodes, peak) != 2) {
      continue;  // over 64 nodes
    }
    ++checked;
    EXPECT_LE(ParseFormatted(peak), 40.0 * (1 << 30) * 1.0001) << line;
    const Result at = RunZtrain(model + " --world-size " + std::to_string(8 * nodes));
    ASSERT_EQ(at.code, 0) << at.out;
    const std::string there = LineAfter(at.out, "every ZeRO stage", row);
    EXPECT_NE(there.find(peak), std::string::npos) << there << " vs " << line;
    if (nodes > 1) {
      const Result fewer = RunZtrain(model + " --world-size " + std::to_string(8 * (nodes - 1)));
      std::istringstream cells(LineAfter(fewer.out, "every ZeRO stage", row));
      std::string cell, v, u;
      std::vector<std::string> sizes;
      cells >> cell >> cell;  // stage, offload
      while (cells >> v >> u) sizes.push_back(v + " " + u);
      ASSERT_GE(sizes.size(), 5u) << fewer.out;
      EXPECT_GT(ParseFormatted(sizes[4]), 40.0 * (1 << 30)) << row << " on " << nodes - 1;
    }
  }
  EXPECT_GE(checked, 2) << r.out;
  const Result bad = RunZtrain(model + " --gpu-memory 40XB");
  EXPECT_EQ(bad.code, 2) << bad.out;
}

// `ztrain estimate --seq-len`: the context-parallel plan (Note [Context-parallel plan]). A small
// Llama (8 query heads over 2 key/value heads) at 16392 = 24 x 683 tokens on 12 ranks: cp 1,
// 2 and 4 by Ulysses, 2, 3, 4, 6 and 12 by ring are estimated, each peak what the estimate of
// that layout says, falling as cp grows; Ulysses at 3, 6 and 12 is refused naming the heads;
// with --gpu-memory between cp 2's and cp 1's peaks the plan is cp 2 by Ulysses.
TEST_F(CliTest, EstimatePlansContextParallelism) {
  nlohmann::json j = DefaultConfigJson();
  j["model"] = {{"type", "llama"},          {"n_layer", 2},       {"n_head", 8},
                {"n_kv_head", 2},           {"head_dim", 32},     {"n_embd", 256},
                {"intermediate_size", 512}, {"vocab_size", 1024}, {"max_seq_len", 1024}};
  j["train_micro_batch_size_per_gpu"] = 1;
  j["gradient_accumulation_steps"] = 1;
  j.erase("train_batch_size");
  const std::string config = WriteConfig(j);
  const int64_t seq = 16392;  // 2 x cp divides it for every cp dividing 12
  const std::string base =
      "estimate --config " + config + " --world-size 12 --seq-len " + std::to_string(seq);
  const Result r = RunZtrain(base);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string table = "context parallelism for 16392 tokens per sample on 12 ranks";
  ASSERT_NE(r.out.find(table), std::string::npos) << r.out;
  std::map<std::string, double> peaks;
  for (const auto& [cp, algorithm] : std::vector<std::pair<int, std::string>>{{1, "-"},
                                                                              {2, "ulysses"},
                                                                              {4, "ulysses"},
                                                                              {2, "ring"},
                                                                              {3, "ring"},
                                                                              {4, "ring"},
                                                                              {6, "ring"},
                                                                              {12, "ring"}}) {
    char prefix[32];
    std::snprintf(prefix, sizeof prefix, "  %-4d %-9s ", cp, algorithm.c_str());
    std::istringstream cells(LineAfter(r.out, table, prefix));
    int size = 0, dp = 0;
    int64_t tokens = 0;
    std::string name, v, u, peak;
    cells >> size >> name >> dp >> tokens >> v >> u >> v >> u;
    peak = v + " " + u;
    EXPECT_EQ(dp, 12 / cp) << prefix << "\n" << r.out;
    EXPECT_EQ(tokens, seq / cp) << prefix << "\n" << r.out;
    peaks[std::to_string(cp) + algorithm] = ParseFormatted(peak);
    nlohmann::json at = j;
    at["context_parallel"] = {{"size", cp}, {"algorithm", cp == 1 ? "ulysses" : algorithm}};
    at["data"]["seq_len"] = seq;
    at["model"]["max_seq_len"] = seq;
    const Result there = RunZtrain(
        "estimate --config " + WriteConfig(at, "cp" + std::to_string(cp) + algorithm + ".json") +
        " --world-size 12");
    ASSERT_EQ(there.code, 0) << there.out;
    EXPECT_NE(LineAfter(there.out, "per rank, peak by category", "  total").find(peak),
              std::string::npos)
        << prefix << peak << "\n"
        << there.out;
  }
  EXPECT_GT(peaks["1-"], peaks["2ulysses"]);
  EXPECT_GT(peaks["2ulysses"], peaks["4ulysses"]);
  EXPECT_GT(peaks["2ring"], peaks["3ring"]);
  EXPECT_GT(peaks["4ring"], peaks["6ring"]);
  for (const int cp : {3, 6, 12}) {
    char prefix[32];
    std::snprintf(prefix, sizeof prefix, "  %-4d %-9s ", cp, "ulysses");
    EXPECT_NE(LineAfter(r.out, table, prefix)
                  .find("refused: context_parallel.size: context_parallel.size " +
                        std::to_string(cp) + " does not divide the 8 query heads"),
              std::string::npos)
        << r.out;
  }
  EXPECT_GT(peaks["6ring"], peaks["12ring"]);
  const auto memory = static_cast<int64_t>((peaks["1-"] + peaks["2ulysses"]) / 2);
  const Result plan = RunZtrain(base + " --gpu-memory " + std::to_string(memory));
  ASSERT_EQ(plan.code, 0) << plan.out;
  EXPECT_NE(plan.out.find("plan: \"context_parallel\": {\"size\": 2, \"algorithm\": \"ulysses\"}"),
            std::string::npos)
      << plan.out;
  const Result none = RunZtrain(base + " --gpu-memory 1MiB");
  ASSERT_EQ(none.code, 0) << none.out;
  EXPECT_NE(none.out.find("plan: no context_parallel size fits"), std::string::npos) << none.out;
}

// `ztrain tune`: the largest micro-batch under a budget, confirmed by a real step; a budget
// that fits nothing exits 1 saying what to do; a bad budget exits 2.
TEST_F(CliTest, TuneFindsTheLargestMicroBatchOrSaysNothingFits) {
  nlohmann::json j = DefaultConfigJson();
  const std::string config = WriteConfig(j);
  const Result r = RunZtrain("tune --config " + config + " --memory-budget 64MiB");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("largest that fits: \"train_micro_batch_size_per_gpu\": "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("in one real step"), std::string::npos) << r.out;
  const Result tiny = RunZtrain("tune --config " + config + " --memory-budget 1KiB");
  EXPECT_EQ(tiny.code, 1) << tiny.out;
  EXPECT_NE(tiny.out.find("nothing fits"), std::string::npos) << tiny.out;
  const Result bad = RunZtrain("tune --config " + config + " --memory-budget lots");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("\"lots\" is not a size"), std::string::npos) << bad.out;
  const Result none = RunZtrain("tune --config " + config, "2>&1");
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find("--memory-budget is required (e.g. 16GiB), or --gemm"),
            std::string::npos)
      << none.out;
  // --gemm: one row per linear and pass with a rate for each backend, and the step's total.
  const Result gemm = RunZtrain("tune --gemm --config " + config);
  ASSERT_EQ(gemm.code, 0) << gemm.out;
  for (const char* row : {"attention q,k,v    forward", "mlp down           weight gradient",
                          "lm head            input gradient", "the step's fp32 GEMMs: "}) {
    EXPECT_NE(gemm.out.find(row), std::string::npos) << row << "\n" << gemm.out;
  }
}

// Note [GEMMs chosen by measurement] as a user meets it: the first run measures the step's
// large shapes, logs what it chose and caches it; the checkpoint records the plan; a resumed
// run reads the cache and measures nothing. `tune --gemm` says which backend a train run keeps.
TEST_F(CliTest, TheFirstRunMeasuresItsGemmsAndLaterRunsReadTheCache) {
  nlohmann::json j = DefaultConfigJson();
  j["model"]["n_layer"] = 1;
  j["model"]["n_embd"] = 256;  // 2 x 256 tokens: shapes of 0.13-0.27 GFLOP
  j["model"]["max_seq_len"] = 256;
  j["train_micro_batch_size_per_gpu"] = 2;
  j["training"]["steps"] = 1;
  j["training"]["eval_interval"] = 0;
  j["training"]["output_dir"] = dir_ + "/out";
  j["checkpoint"] = {{"dir", dir_ + "/ck"}};
  const std::string config = WriteConfig(j);
  const std::string env = kNoGpus + " ZTRAIN_FP32_GEMM= ZTRAIN_CACHE_DIR=" + dir_ + "/cache";
  const Result first = RunZtrain("train --config " + config, "2>&1", env);
  ASSERT_EQ(first.code, 0) << first.out;
  const std::string cache = dir_ + "/cache/gemm-choices.json";
  if (first.out.find("this build has no oneDNN") != std::string::npos) {
    EXPECT_FALSE(fs::exists(cache));
    GTEST_SKIP() << "this build has no oneDNN: OpenBLAS, nothing measured";
  }
  for (const char* part : {"fp32 GEMMs: oneDNN on ", " of 15 shapes",
                           "12 measured now, 0 from the cache, 3 too small", "delete "}) {
    EXPECT_NE(first.out.find(part), std::string::npos) << part << " not in: " << first.out;
  }
  std::ifstream in(cache);
  const nlohmann::json file = nlohmann::json::parse(in);
  const nlohmann::json machines = file.at("machines");
  ASSERT_EQ(machines.size(), 1u);
  const nlohmann::json entries = machines.begin().value();
  EXPECT_EQ(entries.size(), 12u);
  std::ifstream meta_in(dir_ + "/ck/step1/meta.json");
  const std::string plan = nlohmann::json::parse(meta_in).at("gemm_plan");
  for (const auto& [shape, entry] : entries.items()) {  // the checkpoint holds the measured plan
    const std::string named = shape + " " + entry.at("backend").get<std::string>();
    EXPECT_NE(plan.find(named), std::string::npos) << named << " not in " << plan;
  }
  j["training"]["steps"] = 2;
  const Result resumed = RunZtrain("train --resume --config " + WriteConfig(j), "2>&1", env);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("0 measured now, 12 from the cache"), std::string::npos)
      << resumed.out;
  const Result tune = RunZtrain("tune --gemm --config " + config, "2>&1", env);
  ASSERT_EQ(tune.code, 0) << tune.out;
  for (const char* part :
       {"OpenBLAS*", "chosen: oneDNN where its fp32 matmul is at least 5 % faster",
        "caches the choice in "}) {
    EXPECT_NE(tune.out.find(part), std::string::npos) << part << " not in: " << tune.out;
  }
}

// Without GPUs the default "auto" trains on the CPU and says why; "cuda" is a config error
// that names the key and the fix.
TEST_F(CliTest, DeviceIsChosenAndLoggedOrRefusedWithTheFix) {
  nlohmann::json j = DefaultConfigJson();
  j["training"]["steps"] = 1;
  j["training"]["output_dir"] = dir_ + "/out";
  const Result cpu = RunZtrain("train --config " + WriteConfig(j), "2>&1", kNoGpus);
  ASSERT_EQ(cpu.code, 0) << cpu.out;
  EXPECT_NE(cpu.out.find("device: cpu (no CUDA device visible)"), std::string::npos) << cpu.out;
  j["device"] = "cuda";
  const Result cuda = RunZtrain("train --config " + WriteConfig(j), "2>&1", kNoGpus);
  EXPECT_EQ(cuda.code, 2) << cuda.out;
  for (const char* part : {"config error", "device is \"cuda\"", "no CUDA device is visible",
                           "use \"device\": \"cpu\""}) {
    EXPECT_NE(cuda.out.find(part), std::string::npos) << part << " not in: " << cuda.out;
  }
}

TEST_F(CliTest, DataTurnsTextIntoAShard) {
  const std::string text = "héllo, wörld\n";
  std::ofstream(dir_ + "/t.txt") << text;
  const Result r = RunZtrain("data --text " + dir_ + "/t.txt --out " + dir_ + "/t.bin");
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream f(dir_ + "/t.bin", std::ios::binary);
  int32_t header[256];
  f.read(reinterpret_cast<char*>(header), sizeof header);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  ASSERT_EQ(header[2], static_cast<int32_t>(text.size()));
  std::vector<uint16_t> tokens(text.size());
  f.read(reinterpret_cast<char*>(tokens.data()), 2 * tokens.size());
  for (size_t i = 0; i < text.size(); ++i)
    EXPECT_EQ(tokens[i], static_cast<unsigned char>(text[i]));
}

// --token-format uint32 writes llm.c's llama-3 shard (magic 20240801, version 7, 4 bytes a
// token) of the same byte tokens; auto picks uint16 for the byte tokenizer's 256 ids.
TEST_F(CliTest, DataWritesUint32ShardsOnRequest) {
  const std::string text = "h\xC3\xA9llo, w\xC3\xB6rld\n";
  std::ofstream(dir_ + "/t.txt") << text;
  const std::string in = " --text " + dir_ + "/t.txt";
  const Result r = RunZtrain("data" + in + " --out " + dir_ + "/t32.bin --token-format uint32");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("wrote 15 uint32 tokens of 1 documents (1 file, 15 B) in "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  train: 15 tokens in 1 shard: data.train = \"" + dir_ + "/t32.bin\""),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("the model needs vocab_size >= 256"), std::string::npos) << r.out;
  std::ifstream f(dir_ + "/t32.bin", std::ios::binary);
  int32_t header[256];
  f.read(reinterpret_cast<char*>(header), sizeof header);
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  ASSERT_EQ(header[2], 15);
  std::vector<uint32_t> tokens(16, 0xdeadbeef);
  f.read(reinterpret_cast<char*>(tokens.data()), 4 * 16);
  EXPECT_EQ(f.gcount(), 4 * 15);  // nothing after the last token
  for (size_t i = 0; i < text.size(); ++i)
    EXPECT_EQ(tokens[i], static_cast<unsigned char>(text[i])) << i;
  const data::TokenShard shard = data::TokenShard::Open(dir_ + "/t32.bin");
  EXPECT_EQ(shard.format(), data::TokenFormat::kUint32);
  EXPECT_EQ(shard.tokens()[1], 0xC3u);

  const Result automatic =
      RunZtrain("data" + in + " --out " + dir_ + "/t16.bin --token-format auto");
  ASSERT_EQ(automatic.code, 0) << automatic.out;
  EXPECT_NE(automatic.out.find("wrote 15 uint16 tokens"), std::string::npos) << automatic.out;
  EXPECT_EQ(data::TokenShard::Open(dir_ + "/t16.bin").format(), data::TokenFormat::kUint16);
  const Result bad = RunZtrain("data" + in + " --out " + dir_ + "/x.bin --token-format int8");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--token-format"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(dir_ + "/x.bin"));
}

// --decode gives the text of a shard back, byte for byte, across several shards' worth of
// files and a validation split; a missing tokenizer is named.
TEST_F(CliTest, DataDecodesShardsBackToTheirText) {
  std::string a, b;
  for (int i = 0; i < 50; ++i) a += "line " + std::to_string(i) + " \xC3\xA9\n";
  for (int i = 0; i < 40; ++i) b += "{\"text\": \"doc " + std::to_string(i) + "\"}\n";
  std::ofstream(dir_ + "/a.txt") << a;
  std::ofstream(dir_ + "/b.jsonl") << b;
  const Result r = RunZtrain("data " + dir_ + "/a.txt " + dir_ + "/b.jsonl --out " + dir_ +
                             "/c/d.bin --shard-tokens 100 --val-tokens 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("data.train = \"" + dir_ + "/c/d_*.bin\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("data.val = \"" + dir_ + "/c/d.val_*.bin\""), std::string::npos)
      << r.out;
  std::string decoded;
  for (const std::string& shard : data::ExpandGlob(dir_ + "/c/d_*.bin")) {
    const Result d = RunZtrain("data --decode " + shard + " --out " + dir_ + "/dec.txt --overwrite");
    ASSERT_EQ(d.code, 0) << d.out;
    std::ifstream in(dir_ + "/dec.txt", std::ios::binary);
    decoded += std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string docs;
  for (int i = 0; i < 40; ++i) docs += "doc " + std::to_string(i);
  EXPECT_EQ(decoded, docs);
  std::string val;  // a.txt, the first document, is the validation split
  for (const std::string& shard : data::ExpandGlob(dir_ + "/c/d.val_*.bin")) {
    val += RunZtrain("data --decode " + shard, "").out;
  }
  EXPECT_EQ(val, a);
  const Result missing = RunZtrain("data " + dir_ + "/a.txt --out " + dir_ +
                                   "/x.bin --tokenizer " + dir_ + "/no_such_model");
  EXPECT_EQ(missing.code, 1) << missing.out;
  EXPECT_NE(missing.out.find("no_such_model"), std::string::npos) << missing.out;
}

// training.sample_interval prints samples as the run goes; a greedy one at the last step is what
// `ztrain generate` gives from the saved model.
TEST_F(CliTest, TrainingPrintsSamplesThatGenerateReproduces) {
  nlohmann::json j = DefaultConfigJson();
  j["model"] = {{"n_layer", 2}, {"n_head", 4}, {"n_embd", 64}, {"vocab_size", 256},
                {"max_seq_len", 64}};
  j["training"]["steps"] = 10;
  j["training"]["output_dir"] = dir_ + "/out";
  j["training"]["save_final"] = dir_ + "/model/";
  j["training"]["sample_interval"] = 5;
  j["training"]["sample_tokens"] = 16;
  j["training"]["sample_prompt"] = "Once";
  j["training"]["sample_temperature"] = 0.0;
  const Result r = RunZtrain("--config " + WriteConfig(j));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step      5/10 | sample: Once"), std::string::npos) << r.out;
  const Result g = RunZtrain("generate --model " + dir_ + "/model --prompt Once --max-new-tokens 16",
                             "");
  ASSERT_EQ(g.code, 0) << g.out;
  ASSERT_EQ(g.out.rfind("Once", 0), 0u) << g.out;
  const std::string sample = g.out.substr(0, g.out.size() - 1);  // without the newline
  EXPECT_NE(r.out.find("step     10/10 | sample: " + sample), std::string::npos)
      << "generate: " << sample << "\nrun: " << r.out;
}

// The same text as uint16 and as uint32 shards trains the same model: equal losses and
// gradient norms at every step.
TEST_F(CliTest, TrainsTheSameOnUint16AndUint32Shards) {
  std::string text;
  for (int i = 0; text.size() < 3000; ++i) text += "line " + std::to_string(i * i) + " ok\n";
  std::ofstream(dir_ + "/t.txt") << text;
  std::vector<std::string> losses;
  for (const std::string format : {"uint16", "uint32"}) {
    const std::string shard = dir_ + "/" + format + ".bin";
    const Result d =
        RunZtrain("data --text " + dir_ + "/t.txt --out " + shard + " --token-format " + format);
    ASSERT_EQ(d.code, 0) << d.out;
    nlohmann::json j = DefaultConfigJson();
    j["data"]["train"] = shard;
    j["training"]["steps"] = 4;
    j["training"]["output_dir"] = dir_ + "/out_" + format;
    j["csv_monitor"] = {{"enabled", true}, {"output_path", dir_}, {"job_name", format}};
    const Result r = RunZtrain("--config " + WriteConfig(j, format + ".json"));
    ASSERT_EQ(r.code, 0) << r.out;
    std::string columns;  // step,loss,lr,grad_norm of every row
    for (const std::string& row : Lines(dir_ + "/" + format + "/train.csv")) {
      size_t at = 0;
      for (int comma = 0; comma < 4 && at != std::string::npos; ++comma) at = row.find(',', at + 1);
      columns += row.substr(0, at) + "\n";
    }
    losses.push_back(columns);
  }
  EXPECT_EQ(std::count(losses[0].begin(), losses[0].end(), '\n'), 5) << losses[0];
  EXPECT_EQ(losses[1], losses[0]);
}

TEST_F(CliTest, TrainsTheDefaultModelAndWritesCsvAndModel) {
  nlohmann::json j = DefaultConfigJson();
  j["csv_monitor"] = {{"enabled", true}, {"output_path", dir_}, {"job_name", "run"}};
  j["training"]["save_final"] = dir_ + "/final.bin";
  j["training"]["output_dir"] = dir_ + "/out";
  const Result r = RunZtrain("--config " + WriteConfig(j));
  ASSERT_EQ(r.code, 0) << r.out;
  const Config cfg = ParseConfig(j);
  const std::vector<std::string> csv = Lines(dir_ + "/run/train.csv");
  ASSERT_EQ(csv.size(), static_cast<size_t>(cfg.training.steps + 1));
  EXPECT_EQ(csv[0].rfind("step,loss,lr,grad_norm,tokens_per_s", 0), 0u) << csv[0];
  double first_loss = 0, last_loss = 0;
  ASSERT_EQ(std::sscanf(csv[1].c_str(), "1,%lf", &first_loss), 1);
  ASSERT_EQ(std::sscanf(csv.back().c_str(), "%*d,%lf", &last_loss), 1);
  const double ln_vocab = std::log(static_cast<double>(cfg.model.vocab_size));
  EXPECT_NEAR(first_loss, ln_vocab, 0.3);         // an untrained model is uniform
  EXPECT_LT(last_loss, 0.5 * ln_vocab) << r.out;  // and it learned the corpus
  EXPECT_NO_THROW(nn::ReadLlmcModelHeader(dir_ + "/final.bin"));
  std::ifstream mem_file(dir_ + "/out/memory_rank0.json");
  const nlohmann::json mem = nlohmann::json::parse(mem_file);
  // fp32 AdamW: optimizer state (m, v) is exactly twice the parameters, gradients equal them.
  const int64_t params = mem["parameters"]["current"];
  EXPECT_GT(params, 4 * 800000);
  EXPECT_EQ(mem["optimizer_state"]["current"], 2 * params);
  EXPECT_EQ(mem["gradients"]["current"], params);
  EXPECT_GT(mem["activations"]["peak"].get<int64_t>(), 0);
  EXPECT_GE(mem["total"]["peak"].get<int64_t>(), 4 * params);
  // On the CPU backend all of it is the device's.
  EXPECT_EQ(mem["where"]["device"]["peak"], mem["total"]["peak"]);
  EXPECT_EQ(mem["where"]["host"]["peak"], 0);
  EXPECT_NE(r.out.find("val loss"), std::string::npos);
  EXPECT_NE(r.out.find("peak memory"), std::string::npos);
}

// The last "val loss X" printed by a run.
std::string LastValLoss(const std::string& out) {
  const size_t at = out.rfind("val loss ");
  return at == std::string::npos ? ""
                                 : out.substr(at + 9, out.find_first_of(" \n,", at + 9) - at - 9);
}

TEST_F(CliTest, InitFromContinuesFromTheSavedModel) {
  nlohmann::json a = DefaultConfigJson();
  a["training"]["steps"] = 40;
  a["training"]["eval_interval"] = 40;
  a["training"]["save_final"] = dir_ + "/a.bin";
  a["training"]["output_dir"] = dir_ + "/out";
  const Result first = RunZtrain("--config " + WriteConfig(a, "a.json"));
  ASSERT_EQ(first.code, 0) << first.out;
  // One step at lr 0 leaves the loaded weights unchanged, so the evaluation must match the
  // saving run's final evaluation exactly.
  nlohmann::json b = a;
  b["model"]["init_from"] = dir_ + "/a.bin";
  b["training"]["steps"] = 1;
  b["training"]["eval_interval"] = 1;
  b["training"]["save_final"] = "";
  b.erase("scheduler");
  b["optimizer"]["params"]["lr"] = 0.0;
  b["wall_clock_breakdown"] = true;
  const Result second = RunZtrain("--config " + WriteConfig(b, "b.json"));
  ASSERT_EQ(second.code, 0) << second.out;
  ASSERT_FALSE(LastValLoss(first.out).empty()) << first.out;
  EXPECT_EQ(LastValLoss(second.out), LastValLoss(first.out)) << second.out;
  EXPECT_NE(second.out.find("loaded weights from"), std::string::npos);
  EXPECT_NE(second.out.find("time (ms): forward"), std::string::npos) << second.out;
  // A model file of another shape is refused naming the key.
  b["model"]["n_layer"] = 3;
  const Result wrong = RunZtrain("--config " + WriteConfig(b, "c.json"));
  EXPECT_EQ(wrong.code, 2);
  EXPECT_NE(wrong.out.find("n_layer"), std::string::npos) << wrong.out;
}

TEST_F(CliTest, CtrlCStopsAfterTheStepAndSaves) {
  nlohmann::json j = DefaultConfigJson();
  j["training"]["steps"] = 1000000;
  j["training"]["save_final"] = dir_ + "/final.bin";
  j["training"]["output_dir"] = dir_ + "/out";
  j["csv_monitor"] = {{"enabled", true}, {"output_path", dir_}, {"job_name", "run"}};
  const std::string config = WriteConfig(j);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    freopen("/dev/null", "w", stderr);
    execl(ZTRAIN_BINARY, ZTRAIN_BINARY, "--config", config.c_str(), nullptr);
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (Lines(dir_ + "/run/train.csv").size() < 4 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  EXPECT_NO_THROW(nn::ReadLlmcModelHeader(dir_ + "/final.bin"));
  const auto rows = Lines(dir_ + "/run/train.csv");
  EXPECT_GE(rows.size(), 4u);
  EXPECT_LT(rows.size(), 1000u);
}

}  // namespace
}  // namespace ztrain
