// The memory estimate is honest: for every ZeRO stage and offload mode, the real engine's
// MemoryTracker, after construction and two train steps, peaks where EstimateMemory said it
// would, category by category and in total, and in device and pinned memory (the estimate
// runs the engine shape-only: Note [Shape-only engine], estimate/shape_only.h).
// The rule (estimate_check.h): |estimate - measured| <= max(10% of measured, 4 KiB) for every
// category and the total; the modes include bf16, fp16, 16-bit gradients and activation
// checkpointing. layout_equivalence_test applies the same rule on every rank of dp x pp x tp
// layouts. At dp = 2 the sharding arithmetic is checked against closed formulas (no second
// rank is needed for that), and the table, the parameter counts and size strings against
// numbers worked out by hand.
#include "estimate/estimate.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "nn/gpt2.h"
#include "run/run_config.h"
#include "tests/engine/test_model.h"
#include "tests/estimate/estimate_check.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;

// The small GPT-2 of the checks (testing::SmallConfigJson) with micro-batch 4 and 2
// micro-batches per step.
// `extra`: more top-level sections (bf16, fp16, data_types, activation_checkpointing).
Config SmallConfig(const nlohmann::json& zero, int world_size = 1,
                   const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json j = testing::SmallConfigJson(4, 2);
  j["training"]["job_name"] = "estimate_test";
  j["zero_optimization"] = zero;
  for (const auto& [key, value] : extra.items()) j[key] = value;
  return ParseConfig(j, world_size);
}

// Each layer's flat buffer as the engine pads it, for `dp` ranks (an independent count).
std::vector<int64_t> PaddedLayers(const ModelConfig& m, int dp) {
  std::vector<int64_t> sizes;
  for (const auto& layer : nn::BuildGpt2(m)) {
    int64_t n = 0;
    for (const nn::ParamSpec& s : layer->Params()) {
      if (s.tied_to.empty()) n = (n + NumElements(s.shape) + 15) / 16 * 16;
    }
    sizes.push_back((n + 16 * dp - 1) / (16 * dp) * (16 * dp));
  }
  return sizes;
}

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

struct Mode {
  const char* name;
  const char* zero;          // zero_optimization as JSON; "NVME" stands for the swap directory
  const char* extra = "{}";  // other sections: mixed precision, activation checkpointing
};

void PrintTo(const Mode& mode, std::ostream* os) { *os << mode.name; }

std::string Substitute(std::string text, const std::string& dir) {
  for (size_t at; (at = text.find("NVME")) != std::string::npos;) text.replace(at, 4, dir);
  return text;
}

class EstimateHonestTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ztrain_estimate_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

// The bytes of the swap files under `dir` (not the swap directories' lock files).
int64_t SwapFileBytes(const std::string& dir) {
  int64_t bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".swp") {
      bytes += static_cast<int64_t>(e.file_size());
    }
  }
  return bytes;
}

// The small Llama of the checks: grouped-query attention (4 heads over 2 KV heads), a SwiGLU
// MLP 96 wide, RoPE, an untied head; the same sizes otherwise.
nlohmann::json SmallLlama() {
  return {{"type", "llama"},     {"n_layer", 2},       {"n_head", 4},
          {"n_kv_head", 2},      {"n_embd", 64},       {"intermediate_size", 96},
          {"vocab_size", 512},   {"padded_vocab_size", 512}, {"max_seq_len", 64},
          {"tie_word_embeddings", false}};
}

// The engine's tracker against the estimate over construction and two steps in `mode`, for
// the model `model` (empty: SmallConfig's GPT-2).
void ExpectHonest(const Mode& mode, const std::string& dir, const nlohmann::json& model) {
  nlohmann::json extra = nlohmann::json::parse(mode.extra);
  if (!model.empty()) extra["model"] = model;
  const Config cfg = SmallConfig(nlohmann::json::parse(Substitute(mode.zero, dir)), 1, extra);
  EstimateOptions options;
  options.gpu = false;  // the engine here runs on the CPU backend
  const MemoryEstimate e = EstimateMemory(cfg, options);

  Engine engine(
      cfg, nn::BuildModel(cfg.model, nn::MakeWholeLinears(), nn::AdapterPlan(cfg)));
  const int64_t swap_bytes = SwapFileBytes(dir);
  for (int step = 0; step < 2; ++step) {
    testing::OwnedBatch a(4, 64, 512, 10 + step), b(4, 64, 512, 20 + step);
    const nn::MicroBatch batches[] = {a.mb, b.mb};
    engine.TrainStep(batches);
  }
  testing::ExpectEstimateHonest(e, engine.memory().Snapshot(), mode.name);
  EXPECT_EQ(e.device_total_peak, engine.device_memory().TotalPeak());
  EXPECT_EQ(e.pinned_host_peak, engine.pinned_memory().TotalPeak());
  EXPECT_EQ(e.rank_parameters, engine.NumParameters());
  EXPECT_EQ(e.nvme_bytes, swap_bytes) << "the swap files the engine made";
  // On the CPU backend everything is device memory (the host).
  EXPECT_EQ(e.host_total_peak, 0);
  EXPECT_EQ(e.device_total_peak, e.total_peak);
}

TEST_P(EstimateHonestTest, PeaksMatchTheEngine) { ExpectHonest(GetParam(), dir_, {}); }

// The Llama family through the same estimate: nothing in it is per family.
TEST_P(EstimateHonestTest, LlamaPeaksMatchTheEngine) {
  ExpectHonest(GetParam(), dir_, SmallLlama());
}

const Mode kModes[] = {
    {"stage0", R"({"stage": 0})"},
    {"stage1", R"({"stage": 1})"},
    {"stage2", R"({"stage": 2})"},
    {"stage3", R"({"stage": 3})"},
    {"stage1_opt_cpu",
     R"({"stage": 1, "offload_optimizer": {"device": "cpu", "pin_memory": true}})"},
    {"stage2_opt_cpu", R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})"},
    {"stage3_opt_cpu",
     R"({"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true}})"},
    {"stage3_param_opt_cpu", R"({"stage": 3, "offload_param": {"device": "cpu", "pin_memory": true},
                                 "offload_optimizer": {"device": "cpu", "pin_memory": true}})"},
    {"stage2_opt_nvme", R"({"stage": 2, "sub_group_size": 3000,
                            "offload_optimizer": {"device": "nvme", "nvme_path": "NVME",
                                                  "pipeline_read": true,
                                                  "pipeline_write": true}})"},
    // Small buffers: the LM head's shard stays in memory, the rest passes through 2 buffers;
    // tiles of 3000 elements cross layers.
    {"stage3_both_nvme", R"({"stage": 3, "sub_group_size": 3000,
                             "stage3_param_persistence_threshold": 0,
                             "offload_param": {"device": "nvme", "nvme_path": "NVME",
                                               "max_in_cpu": 200, "buffer_count": 2,
                                               "buffer_size": 60000},
                             "offload_optimizer": {"device": "nvme", "nvme_path": "NVME",
                                                   "pipeline_read": true}})"},
    // One layer per gradient bucket, reduced behind backward.
    {"stage2_buckets", R"({"stage": 2, "reduce_bucket_size": 1, "overlap_comm": true})"},
    // Nothing gathered beyond the layer in use.
    {"stage3_tight", R"({"stage": 3, "stage3_max_live_parameters": 0,
                         "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0,
                         "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 1})"},
    {"stage3_no_overlap", R"({"stage": 3, "overlap_comm": false,
                              "stage3_param_persistence_threshold": 0})"},
    // Mixed precision and activation checkpointing (issue 8), across stages and offload.
    {"stage0_bf16", R"({"stage": 0})", R"({"bf16": {"enabled": true}})"},
    {"stage1_bf16_grads_bf16", R"({"stage": 1})",
     R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"}})"},
    {"stage2_fp16", R"({"stage": 2})", R"({"fp16": {"enabled": true}})"},
    {"stage3_bf16", R"({"stage": 3, "stage3_param_persistence_threshold": 0})",
     R"({"bf16": {"enabled": true}})"},
    {"stage3_bf16_both_nvme", R"({"stage": 3, "sub_group_size": 3000,
                                  "stage3_param_persistence_threshold": 0,
                                  "offload_param": {"device": "nvme", "nvme_path": "NVME",
                                                    "max_in_cpu": 200, "buffer_count": 2,
                                                    "buffer_size": 60000},
                                  "offload_optimizer": {"device": "nvme", "nvme_path": "NVME"}})",
     R"({"bf16": {"enabled": true}})"},
    {"stage0_checkpointing", R"({"stage": 0})",
     R"({"activation_checkpointing": {"enabled": true}})"},
    {"stage3_checkpoint_1", R"({"stage": 3, "stage3_param_persistence_threshold": 0})",
     R"({"activation_checkpointing": {"number_checkpoints": 1}})"},
    {"stage2_opt_cpu_bf16_checkpointing", R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})",
     R"({"bf16": {"enabled": true}, "activation_checkpointing": {"enabled": true}})"},
    // LoRA (issue 19): a frozen base in the compute dtype, adapters and biases trained.
    {"stage0_lora", R"({"stage": 0})",
     R"({"lora": {"r": 4, "target_modules": "all-linear", "bias": "all"}})"},
    {"stage3_lora_bf16", R"({"stage": 3, "stage3_param_persistence_threshold": 0})",
     R"({"bf16": {"enabled": true}, "lora": {"r": 4, "target_modules": "all-linear"}})"},
    {"stage3_lora_param_opt_cpu",
     R"({"stage": 3, "offload_param": {"device": "cpu", "pin_memory": true},
                                      "offload_optimizer": {"device": "cpu"}})",
     R"({"lora": {"r": 4, "target_modules": "all-linear"},
         "activation_checkpointing": {"enabled": true}})"},
    {"stage2_lora_opt_nvme", R"({"stage": 2, "sub_group_size": 3000,
                                "offload_optimizer": {"device": "nvme", "nvme_path": "NVME"}})",
     R"({"lora": {"r": 4}})"},
    // QLoRA: the base's block linears quantized (their blobs in the frozen region, dequantized
    // per GEMM into scratch the layers allocate).
    {"stage0_qlora_nf4", R"({"stage": 0})",
     R"({"lora": {"r": 4, "target_modules": "all-linear"},
         "quantization": {"load_in_4bit": true, "bnb_4bit_quant_type": "nf4"}})"},
    {"stage3_qlora_nf4_dq_bf16", R"({"stage": 3, "stage3_param_persistence_threshold": 0})",
     R"({"bf16": {"enabled": true}, "lora": {"r": 4},
         "quantization": {"load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
                          "bnb_4bit_use_double_quant": true}})"},
    {"stage3_qlora_int8_param_cpu_checkpointing",
     R"({"stage": 3, "offload_param": {"device": "cpu", "pin_memory": true}})",
     R"({"lora": {"r": 4, "target_modules": "all-linear"},
         "quantization": {"load_in_8bit": true},
         "activation_checkpointing": {"enabled": true}})"},
};

INSTANTIATE_TEST_SUITE_P(AllModes, EstimateHonestTest, ::testing::ValuesIn(kModes),
                         [](const auto& info) { return std::string(info.param.name); });

// --- dp = 2: the sharding arithmetic against closed formulas ---------------------------------

TEST(EstimateShardingTest, Stage1ShardsOptimizerStateAndGathersEveryShard) {
  const Config cfg = SmallConfig({{"stage", 1}}, 2);
  EstimateOptions options;
  options.gpu = false;
  const MemoryEstimate e = EstimateMemory(cfg, options);
  const std::vector<int64_t> padded = PaddedLayers(cfg.model, 2);
  const int64_t psi = Sum(padded), shard = psi / 2;
  EXPECT_EQ(e.dp, 2);
  EXPECT_EQ(e.padded_elements, psi);
  EXPECT_EQ(e.Peak(MemoryCategory::kParameters), 4 * psi);
  EXPECT_EQ(e.Peak(MemoryCategory::kGradients), 4 * psi + 4 * shard);  // full + reduced shard
  EXPECT_EQ(e.Peak(MemoryCategory::kOptimizerState), 8 * shard);       // m and v of the shard
  // The all-gather after the step: every shard's send copy in flight at once (the default
  // allgather_bucket_size holds the whole model).
  EXPECT_EQ(e.Peak(MemoryCategory::kCommunication), 4 * shard);
}

TEST(EstimateShardingTest, Stage2OneLayerBucketsKeepTheTiedEmbeddingAndOneMore) {
  const Config cfg = SmallConfig({{"stage", 2},
                                  {"reduce_bucket_size", 1},
                                  {"overlap_comm", false},
                                  {"allgather_bucket_size", 1}},
                                 2);
  EstimateOptions options;
  options.gpu = false;
  const MemoryEstimate e = EstimateMemory(cfg, options);
  const std::vector<int64_t> padded = PaddedLayers(cfg.model, 2);
  const int64_t shard = Sum(padded) / 2;
  const int64_t largest_after_embedding = *std::max_element(padded.begin() + 1, padded.end());
  // The embedding's full gradient lives through backward (the LM head writes into it); every
  // other layer's is reduced and freed before the next layer's backward.
  EXPECT_EQ(e.Peak(MemoryCategory::kGradients),
            4 * shard + 4 * (padded[0] + largest_after_embedding));
  // One layer's reduced shard at a time, and after the step one layer's shard in the
  // parameter all-gather (allgather_bucket_size 1).
  const int64_t largest_shard = *std::max_element(padded.begin(), padded.end()) / 2;
  EXPECT_EQ(e.Peak(MemoryCategory::kCommunication), 4 * largest_shard);
  EXPECT_EQ(e.Peak(MemoryCategory::kOptimizerState), 8 * shard);
}

TEST(EstimateShardingTest, Stage3TightGathersOnePositionAtATime) {
  const Config cfg = SmallConfig({{"stage", 3},
                                  {"stage3_max_live_parameters", 0},
                                  {"stage3_prefetch_bucket_size", 0},
                                  {"stage3_max_reuse_distance", 0},
                                  {"stage3_param_persistence_threshold", 0}},
                                 2);
  EstimateOptions options;
  options.gpu = false;
  const MemoryEstimate e = EstimateMemory(cfg, options);
  const std::vector<int64_t> padded = PaddedLayers(cfg.model, 2);
  const int64_t shard = Sum(padded) / 2;
  // The LM head needs its own buffer and the embedding's (tied): the largest position.
  const int64_t widest = std::max(padded[1], padded.back() + padded[0]);
  EXPECT_EQ(e.Peak(MemoryCategory::kParameters), 4 * shard + 4 * widest);
  EXPECT_EQ(e.Peak(MemoryCategory::kOptimizerState), 8 * shard);
}

TEST(EstimateShardingTest, OffloadOnAGpuMovesOptimizerStateToPinnedHostMemory) {
  const Config cfg = SmallConfig(
      {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}, {"pin_memory", true}}}}, 2);
  EstimateOptions options;
  options.gpu = true;
  const MemoryEstimate e = EstimateMemory(cfg, options);
  const int64_t shard = Sum(PaddedLayers(cfg.model, 2)) / 2;
  EXPECT_EQ(e.DevicePeak(MemoryCategory::kOptimizerState), 0);
  // m and v, and the fp32 master of the shard (ZeRO-Offload), all pinned.
  EXPECT_EQ(e.HostPeak(MemoryCategory::kOptimizerState), 12 * shard);
  // The reduced shard on the GPU and its pinned host copy for the host's AdamW.
  EXPECT_EQ(e.HostPeak(MemoryCategory::kGradients), 4 * shard);
  EXPECT_EQ(e.pinned_host_peak, 16 * shard);
}

// Note [Offloaded shards beside compute] (engine.cc): on a GPU under bf16 each offloaded
// stage-3 shard keeps its bf16 copy in pinned host memory beside the fp32 master, for the
// gathers to move.
TEST(EstimateShardingTest, OffloadedShardsOnAGpuKeepTheirBf16CopyOnTheHost) {
  const nlohmann::json zero = {{"stage", 3},
                               {"offload_param", {{"device", "cpu"}, {"pin_memory", true}}},
                               {"offload_optimizer", {{"device", "cpu"}, {"pin_memory", true}}}};
  EstimateOptions options;
  options.gpu = true;
  const Config fp32_config = SmallConfig(zero, 2);
  const MemoryEstimate fp32 = EstimateMemory(fp32_config, options);
  const MemoryEstimate bf16 =
      EstimateMemory(SmallConfig(zero, 2, {{"bf16", {{"enabled", true}}}}), options);
  const int64_t shard = Sum(PaddedLayers(fp32_config.model, 2)) / 2;
  EXPECT_EQ(fp32.HostPeak(MemoryCategory::kParameters), 4 * shard);
  EXPECT_EQ(bf16.HostPeak(MemoryCategory::kParameters), 6 * shard);
  EXPECT_EQ(bf16.pinned_host_peak - fp32.pinned_host_peak, 2 * shard);
}

// cpu_checkpointing on a GPU (checked by hand: no GPU runs the engine here): each checkpointed
// block's input waits in pinned host memory from its forward to its backward, and the device
// no longer holds it. Blocks 0 and 1 of the 2-block model keep the inputs of layers 1 and 2
// (the embedding's output and block 0's), one micro-batch at a time without a pipeline.
TEST(EstimateShardingTest, CpuCheckpointingOnAGpuKeepsBlockInputsInPinnedHostMemory) {
  const nlohmann::json plain = {{"activation_checkpointing", {{"enabled", true}}}};
  nlohmann::json offloaded = plain;
  offloaded["activation_checkpointing"]["cpu_checkpointing"] = true;
  EstimateOptions options;
  options.gpu = true;
  const MemoryEstimate a = EstimateMemory(SmallConfig({{"stage", 0}}, 1, plain), options);
  const MemoryEstimate b = EstimateMemory(SmallConfig({{"stage", 0}}, 1, offloaded), options);
  const int64_t input = 4 * 64 * 64 * 4;  // B x T x C fp32
  EXPECT_EQ(a.HostPeak(MemoryCategory::kActivations), 0);
  EXPECT_EQ(b.HostPeak(MemoryCategory::kActivations), 2 * input);
  EXPECT_EQ(b.pinned_host_peak - a.pinned_host_peak, 2 * input);
  EXPECT_LT(b.DevicePeak(MemoryCategory::kActivations), a.DevicePeak(MemoryCategory::kActivations));
}

// QLoRA at ZeRO-3 (Note [Quantized base]): each of 8 ranks holds 1/8 of the quantized base,
// whose bytes are NF4's with double quantization: per weight 1/2 byte of code and 1/64 of an
// absmax code, per tensor its 256-block scales and offset. A Llama of 4 blocks, every width a
// multiple of 64 so the blobs have no short blocks; fp32, so the rest of the frozen base (the
// embeddings, the head, the norms) is 4 bytes an element, as is every trained one. What 8
// ranks save against 1 is 7/8 of that resident state (the gathered layers are the same).
TEST(EstimateShardingTest, Stage3ShardsTheQuantizedBase) {
  nlohmann::json model = SmallLlama();
  model["n_layer"] = 4;
  model["n_embd"] = 512;
  model["n_head"] = 8;
  model["n_kv_head"] = 4;
  model["intermediate_size"] = 1536;
  model["vocab_size"] = 1024;
  model["padded_vocab_size"] = 1024;
  const nlohmann::json extra = {
      {"model", model},
      {"lora", {{"r", 8}, {"target_modules", "all-linear"}}},
      {"quantization",
       {{"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"}, {"bnb_4bit_use_double_quant", true}}}};
  const nlohmann::json zero = {{"stage", 3}, {"stage3_param_persistence_threshold", 0}};
  EstimateOptions options;
  options.gpu = true;
  const MemoryEstimate one = EstimateMemory(SmallConfig(zero, 1, extra), options);
  const MemoryEstimate eight = EstimateMemory(SmallConfig(zero, 8, extra), options);
  // The resident bytes of one rank holding everything, from the shapes alone.
  const int64_t c = 512, kv = 4 * 64, ffn = 1536;
  const int64_t per_block[] = {c * c, kv * c, kv * c, c * c, ffn * c, ffn * c, c * ffn};
  double resident = 0.0;
  for (const int64_t n : per_block) {
    const int64_t blocks = n / 64;
    resident += 4 * (double(n) * (0.5 + 1.0 / 64) + 4.0 * ((blocks + 255) / 256) + 4.0);
  }
  // Elements: A [8, in] and B [out, 8] of the 7 linears of 4 blocks; the embedding, the
  // head, 2 norms a block and the final one.
  const int64_t trained = 4 * 8 * (2 * c + 2 * (c + kv) + 2 * c + 3 * (c + ffn));
  const int64_t other_frozen = 2 * 1024 * c + 9 * c;
  resident += 4.0 * double(trained + other_frozen);
  const double saved = double(one.DevicePeak(MemoryCategory::kParameters) -
                              eight.DevicePeak(MemoryCategory::kParameters));
  EXPECT_NEAR(saved, resident * 7.0 / 8.0, 0.01 * resident)
      << "one rank " << one.DevicePeak(MemoryCategory::kParameters) << ", eight "
      << eight.DevicePeak(MemoryCategory::kParameters);
  // Optimizer state: 8 bytes (fp32 m and v) per trained element, sharded 8 ways.
  EXPECT_NEAR(double(eight.DevicePeak(MemoryCategory::kOptimizerState)), 8.0 * trained / 8,
              0.02 * 8.0 * trained / 8);
}

// The shape-only engine writes no page of the memory it counts (Note [Shape-only engine]):
// Llama-3.1-8B at ZeRO 0 on one rank, 128 GB of model state and optimizer, and its 11-row
// table, leave this process's peak resident memory where it was, give or take the layers'
// probes (micro-batches 1 and 2) and the bookkeeping.
TEST(EstimateCostTest, AnEightBillionModelIsEstimatedWithoutItsMemory) {
  const Config c =
      LoadRunConfig(std::string(ZTRAIN_CONFIGS_DIR) + "/llama3_1_8b.json", 1, LaunchEnv{});
  EstimateOptions options;
  options.gpu = false;
  struct rusage before {};
  getrusage(RUSAGE_SELF, &before);
  const MemoryEstimate e = EstimateMemory(c, options);
  const std::vector<EstimateRow> rows = EstimateTable(c, options);
  struct rusage after {};
  getrusage(RUSAGE_SELF, &after);
  EXPECT_GT(e.Peak(MemoryCategory::kOptimizerState), int64_t{64} * 1000000000);  // m and v
  EXPECT_EQ(rows.size(), 11u);
  const long grown_kib = after.ru_maxrss - before.ru_maxrss;
  std::printf("8B estimate: %s estimated on this rank; resident peak grew %ld KiB\n",
              FormatBytes(e.total_peak).c_str(), grown_kib);
  EXPECT_LT(grown_kib, 512 * 1024) << "the estimate wrote memory it only had to count";
}

// --- Parameter counts, models by size, size strings -------------------------------------------

TEST(EstimateCountTest, ParameterCountsAreTheLayersDeclarations) {
  const Config cfg = SmallConfig({{"stage", 0}});
  Engine engine(cfg, nn::BuildGpt2(cfg.model));
  const MemoryEstimate e = EstimateMemory(cfg);
  EXPECT_EQ(e.model_parameters, engine.NumParameters());
  EXPECT_EQ(e.rank_parameters, engine.NumParameters());
  EXPECT_EQ(Gpt2ParameterCount(cfg.model), engine.NumParameters());
  EXPECT_EQ(e.padded_elements, Sum(PaddedLayers(cfg.model, 1)));
  // GPT-2 124M as llm.c counts it.
  nlohmann::json j = DefaultConfigJson();
  j["model"] = {{"n_layer", 12},
                {"n_head", 12},
                {"n_embd", 768},
                {"vocab_size", 50257},
                {"padded_vocab_size", 50304},
                {"max_seq_len", 1024}};
  const Config gpt2 = ParseConfig(j);
  EXPECT_EQ(EstimateMemory(gpt2).model_parameters, 124475904);
  EXPECT_EQ(Gpt2ParameterCount(gpt2.model), 124475904);
}

// Note [Size limits]: a model given by an absurd size is a named error, never a wrapped width or
// a negative parameter count.
TEST(EstimateCountTest, AbsurdSizesAreNamed) {
  EXPECT_THROW(ModelFromSize({.params = 0, .layers = 32, .hidden = int64_t{1} << 33, .vocab = 100},
                             ModelConfig{}),
               ConfigError);
  ModelConfig m;
  m.n_embd = 1 << 30;
  m.n_layer = 65536;
  EXPECT_THROW(Gpt2ParameterCount(m), ConfigError);
}

TEST(EstimateCountTest, ModelFromSizeHitsTheCount) {
  const ModelConfig m =
      ModelFromSize({.params = 7000000000, .layers = 32, .hidden = 4096}, ModelConfig{});
  EXPECT_EQ(m.n_layer, 32);
  EXPECT_EQ(m.n_embd, 4096);
  EXPECT_EQ(m.n_head, 64);
  EXPECT_EQ(m.padded_vocab_size % 128, 0);
  // The vocabulary takes what the blocks leave; padding adds at most 127 rows.
  EXPECT_GE(Gpt2ParameterCount(m), 7000000000 - 4096);
  EXPECT_LE(Gpt2ParameterCount(m), 7000000000 + 128 * 4096);
  const ModelConfig v = ModelFromSize(
      {.layers = 2, .hidden = 64, .heads = 4, .vocab = 500, .seq = 32}, ModelConfig{});
  EXPECT_EQ(v.vocab_size, 500);
  EXPECT_EQ(v.padded_vocab_size, 512);
  EXPECT_EQ(v.max_seq_len, 32);
  EXPECT_THROW(ModelFromSize({.params = 1000, .layers = 32, .hidden = 4096}, ModelConfig{}),
               ConfigError);
  EXPECT_THROW(ModelFromSize({.params = 7000000000, .layers = 0, .hidden = 4096}, ModelConfig{}),
               ConfigError);
  EXPECT_THROW(
      ModelFromSize({.params = 7000000000, .layers = 2, .hidden = 100, .heads = 3}, ModelConfig{}),
      ConfigError);
}

TEST(EstimateCountTest, ParseCountReadsSuffixes) {
  EXPECT_EQ(ParseCount("7B"), 7000000000);
  EXPECT_EQ(ParseCount("1.5b"), 1500000000);
  EXPECT_EQ(ParseCount("125M"), 125000000);
  EXPECT_EQ(ParseCount("350k"), 350000);
  EXPECT_EQ(ParseCount("2T"), 2000000000000);
  EXPECT_EQ(ParseCount("7e9"), 7000000000);
  EXPECT_EQ(ParseCount("124475904"), 124475904);
  for (const char* bad : {"", "B", "7X", "7BB", "-1", "0", " 7B", "7 B", "abc"}) {
    EXPECT_THROW(ParseCount(bad, "--params"), ConfigError) << "'" << bad << "'";
  }
}

// --- The side-by-side table --------------------------------------------------------------------

TEST(EstimateTableTest, CoversEveryStageAndOffloadChoice) {
  // A 1.3B-parameter model on 8 GPUs.
  nlohmann::json j = DefaultConfigJson();
  j["model"] = {{"n_layer", 24},
                {"n_head", 16},
                {"n_embd", 2048},
                {"vocab_size", 50257},
                {"max_seq_len", 1024}};
  j["data"] = {{"seq_len", 1024}};
  j["train_micro_batch_size_per_gpu"] = 1;
  j["device"] = "cuda";
  const Config cfg = ParseConfig(j, 8);
  const std::vector<EstimateRow> rows = EstimateTable(cfg);
  ASSERT_EQ(rows.size(), 11u);
  const char* expected[][2] = {{"0", "none"},          {"1", "none"},
                               {"1", "optimizer cpu"}, {"1", "nvme"},
                               {"2", "none"},          {"2", "optimizer cpu"},
                               {"2", "nvme"},          {"3", "none"},
                               {"3", "optimizer cpu"}, {"3", "optimizer+param cpu"},
                               {"3", "nvme"}};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(std::to_string(rows[i].stage), expected[i][0]) << i;
    EXPECT_EQ(rows[i].offload, expected[i][1]) << i;
    EXPECT_EQ(rows[i].plain.zero_stage, rows[i].stage);
  }
  const int64_t psi = rows[0].plain.padded_elements, shard = psi / 8;
  // Stage 0 holds everything: 16 bytes per parameter of model state on the GPU.
  EXPECT_EQ(rows[0].plain.DevicePeak(MemoryCategory::kParameters), 4 * psi);
  EXPECT_EQ(rows[0].plain.DevicePeak(MemoryCategory::kOptimizerState), 8 * psi);
  // Stage 1 shards m and v; optimizer offload takes them (and the master) to the host.
  EXPECT_EQ(rows[1].plain.DevicePeak(MemoryCategory::kOptimizerState), 8 * shard);
  EXPECT_EQ(rows[2].plain.DevicePeak(MemoryCategory::kOptimizerState), 0);
  EXPECT_EQ(rows[2].plain.HostPeak(MemoryCategory::kOptimizerState), 12 * shard);
  // NVMe: m and v live in the swap file; nothing of them in memory but the tile buffers.
  EXPECT_EQ(rows[3].plain.Peak(MemoryCategory::kOptimizerState), 4 * shard);  // the master
  EXPECT_GE(rows[3].plain.nvme_bytes, 8 * shard);
  // Stage 3 keeps the shard and gathers layers by the same plan whatever the offload; with
  // parameters offloaded only the gathered ones are on the GPU.
  EXPECT_LT(rows[7].plain.DevicePeak(MemoryCategory::kParameters), 4 * psi);
  EXPECT_EQ(rows[9].plain.DevicePeak(MemoryCategory::kParameters),
            rows[7].plain.DevicePeak(MemoryCategory::kParameters) - 4 * shard);
  EXPECT_EQ(rows[9].plain.HostPeak(MemoryCategory::kParameters), 4 * shard);
  // max_in_cpu (1e9 elements by default) keeps these parameter shards in memory: only m and
  // v go to the file, one record per layer (a tile never crosses layers), m and v each
  // padded to 4 KiB. The host's AdamW steps each shard where the swapper holds it (Note
  // [Sharded optimizer]), with no staged copy; the peak is at initialisation, which stages
  // one layer's shard at a time (the largest: the embedding's).
  const std::vector<int64_t> layers = PaddedLayers(cfg.model, 8);
  EXPECT_GE(rows[10].plain.nvme_bytes, 8 * shard);
  EXPECT_LT(rows[10].plain.nvme_bytes, 8 * shard + 2 * 4096 * static_cast<int64_t>(layers.size()));
  const int64_t largest = *std::max_element(layers.begin(), layers.end());
  EXPECT_EQ(rows[10].plain.HostPeak(MemoryCategory::kParameters), 4 * shard + 4 * (largest / 8));
  EXPECT_GT(rows[0].plain.device_total_peak, rows[1].plain.device_total_peak);
  EXPECT_GT(rows[7].plain.device_total_peak, rows[9].plain.device_total_peak);
  // The table's row for the config's own layout is the config's estimate.
  EXPECT_EQ(rows[0].plain.device_total_peak, EstimateMemory(cfg).device_total_peak);
}

// Every shipped config resolves and is estimated; the Llama recipes have the parameter counts
// of the models they are named after (Hugging Face's Llama-3.2-1B: 1,235,814,400 with the
// tied head; Llama-3.1-8B: 8,030,261,248).
TEST(EstimateRecipeTest, ShippedConfigsResolveAndTheLlamaRecipesHaveTheRealShapes) {
  int configs = 0;
  for (const auto& entry : fs::directory_iterator(ZTRAIN_CONFIGS_DIR)) {
    if (entry.path().extension() != ".json") continue;
    const Config c = LoadRunConfig(entry.path().string(), 8, LaunchEnv{});
    EstimateOptions options;
    options.gpu = true;
    const MemoryEstimate e = EstimateMemory(c, options);
    EXPECT_GT(e.total_peak, 0) << entry.path();
    ++configs;
  }
  EXPECT_GE(configs, 10);
  const auto parameters = [](const char* name) {
    const Config c = LoadRunConfig(std::string(ZTRAIN_CONFIGS_DIR) + "/" + name, 8, LaunchEnv{});
    return EstimateMemory(c).model_parameters;
  };
  EXPECT_EQ(parameters("llama3_2_1b.json"), 1235814400);
  EXPECT_EQ(parameters("llama3_1_8b.json"), 8030261248);
}

// The (Q)LoRA recipes fit the cards docs/memory.md says they fit, with the room it says: the
// GPU peak below the card less 1.5 GB for the CUDA context and libraries, which the tracker
// does not see.
TEST(EstimateRecipeTest, TheQloraRecipesFitTheirCards) {
  struct Recipe {
    const char* config;
    int world;
    double card_gb;
  };
  for (const Recipe& r : {Recipe{"lora_llama2_13b_int8.json", 1, 16},
                          Recipe{"qlora_llama2_13b.json", 1, 16},
                          Recipe{"qlora_llama_65b.json", 1, 48},
                          Recipe{"qlora_llama2_7b_zero3.json", 8, 16}}) {
    const Config c =
        LoadRunConfig(std::string(ZTRAIN_CONFIGS_DIR) + "/" + r.config, r.world, LaunchEnv{});
    ASSERT_TRUE(c.lora.enabled && c.quantization.enabled()) << r.config;
    EstimateOptions options;
    options.gpu = true;
    const MemoryEstimate e = EstimateMemory(c, options);
    EXPECT_LT(static_cast<double>(e.device_total_peak), (r.card_gb - 1.5) * 1e9) << r.config;
  }
}

}  // namespace
}  // namespace ztrain
