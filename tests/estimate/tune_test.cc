// The micro-batch tuner (estimate/tune.h): the largest size the estimate fits in a budget,
// confirmed by a real step that measures within it; budgets too small; size parsing; the
// step's GEMM shapes and their measured backends.
#include "estimate/tune.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "estimate/estimate.h"
#include "kernels/cpu/gemm_choice.h"
#include "kernels/cpu/onednn_matmul.h"
#include "tests/engine/test_model.h"
#include "tests/expect_error.h"
#include "tests/scoped_env.h"
#include "tests/temp_dir.h"

namespace ztrain {
namespace {

Config SmallConfig() { return ParseConfig(testing::SmallConfigJson(1, 2)); }

int64_t PeakAt(const Config& c, int64_t b) {
  return EstimateMemory(WithMicroBatch(c, b)).device_total_peak;
}

TEST(TuneTest, FindsTheLargestMicroBatchThatFitsAndConfirmsIt) {
  const Config c = SmallConfig();
  ASSERT_LT(PeakAt(c, 6), PeakAt(c, 7)) << "activations grow with the micro-batch";
  // A budget between the peaks of 6 and 7: doubling reaches 8, bisection comes back to 6.
  const int64_t budget = (PeakAt(c, 6) + PeakAt(c, 7)) / 2;
  const TuneResult r = TuneMicroBatch(c, budget, 64, /*confirm=*/true);
  EXPECT_EQ(r.micro_batch, 6);
  EXPECT_EQ(r.estimated_peak, PeakAt(c, 6));
  ASSERT_TRUE(r.confirmed);
  EXPECT_LE(r.measured_peak, budget);
  EXPECT_NEAR(static_cast<double>(r.measured_peak), static_cast<double>(r.estimated_peak),
              0.1 * static_cast<double>(r.estimated_peak));
  // Tried: 1, 2, 4, 8 (over), then 6, 7 (over).
  ASSERT_GE(r.tried.size(), 5u);
  EXPECT_EQ(r.tried[3].first, 8);
  EXPECT_GT(r.tried[3].second, budget);
}

TEST(TuneTest, TheCapAndATooSmallBudget) {
  const Config c = SmallConfig();
  EXPECT_EQ(TuneMicroBatch(c, int64_t{1} << 40, 5, false).micro_batch, 5);
  const TuneResult none = TuneMicroBatch(c, PeakAt(c, 1) - 1, 64, true);
  EXPECT_EQ(none.micro_batch, 0);
  EXPECT_FALSE(none.confirmed);
}

// Note [Size limits]: sizes past the config's limits count as not fitting (an absurd cap
// never overflows the doubling), and a budget beyond the machine is not confirmed by a step.
TEST(TuneTest, AnAbsurdBudgetAndCapStayWithinTheSizeLimits) {
  const Config c = SmallConfig();
  const TuneResult r = TuneMicroBatch(c, int64_t{1} << 61, INT64_MAX, /*confirm=*/true);
  ASSERT_GT(r.micro_batch, 0);
  EXPECT_TRUE(std::any_of(r.tried.begin(), r.tried.end(), [](const auto& t) { return t.second < 0; }))
      << "a size past the limits was tried and did not fit";
  EXPECT_THROW(WithMicroBatch(c, r.micro_batch + 1), ConfigError);
  EXPECT_FALSE(r.confirmed);
  EXPECT_NE(r.unconfirmed.find("more than this machine's"), std::string::npos) << r.unconfirmed;
  testing::ExpectErrorWith<ConfigError>([] { ParseBytes("1e30GiB"); }, {"more than 2^62 bytes"});
}

TEST(TuneTest, BudgetsParse) {
  EXPECT_EQ(ParseBytes("16GiB"), int64_t{16} << 30);
  EXPECT_EQ(ParseBytes("512 MiB"), int64_t{512} << 20);
  EXPECT_EQ(ParseBytes("2GB"), 2000000000);
  EXPECT_EQ(ParseBytes("1.5g"), int64_t{3} << 29);
  EXPECT_EQ(ParseBytes("4096"), 4096);
  EXPECT_EQ(ParseBytes("1e9"), 1000000000);
  for (const char* bad : {"", "GiB", "16 parsecs", "-1GiB", "0", "nan"}) {
    testing::ExpectErrorWith<ConfigError>([&] { ParseBytes(bad); }, {"is not a size", bad});
  }
}

}  // namespace
}  // namespace ztrain

namespace ztrain {
namespace {

// `ztrain tune --gemm`'s shapes for GPT-2 124M at micro-batch 4 x 64 tokens, by hand: every
// linear's forward, input-gradient and weight-gradient products, each block's 12 times.
TEST(TuneTest, StepGemmShapesAreTheLinearsProducts) {
  nlohmann::json j = testing::TinyConfigJson();
  j["model"] = {{"n_layer", 12}, {"n_head", 12}, {"n_embd", 768}, {"vocab_size", 50257},
                {"max_seq_len", 64}};
  j["data"]["seq_len"] = 64;
  j["train_micro_batch_size_per_gpu"] = 4;
  const std::vector<StepGemm> shapes = StepGemmShapes(ParseConfig(j));
  ASSERT_EQ(shapes.size(), 15u);
  const auto expect = [&](size_t i, const char* linear, const char* pass, int64_t m, int64_t n,
                          int64_t k, int64_t count) {
    EXPECT_EQ(shapes[i].linear, linear);
    EXPECT_EQ(shapes[i].pass, pass);
    const kernels::GemmShape& s = shapes[i].shape;
    EXPECT_EQ(std::vector<int64_t>({s.m, s.n, s.k, shapes[i].count}),
              std::vector<int64_t>({m, n, k, count}))
        << linear << " " << pass;
    // The transposes CpuOps's linear layer gives each pass (kernels/cpu/gemm.cc).
    const std::string_view p = pass;
    EXPECT_EQ(s.trans_a, p == "weight gradient") << linear << " " << pass;
    EXPECT_EQ(s.trans_b, p == "forward") << linear << " " << pass;
  };
  expect(0, "attention q,k,v", "forward", 256, 2304, 768, 12);
  expect(1, "attention q,k,v", "input gradient", 256, 768, 2304, 12);
  expect(2, "attention q,k,v", "weight gradient", 2304, 768, 256, 12);
  expect(3, "attention output", "forward", 256, 768, 768, 12);
  expect(6, "mlp up", "forward", 256, 3072, 768, 12);
  expect(9, "mlp down", "forward", 256, 768, 3072, 12);
  expect(12, "lm head", "forward", 256, 50304, 768, 1);
  // Llama: grouped key/value heads in the fused projection, gate and up apart.
  nlohmann::json l = testing::TinyLlamaConfigJson();
  l["train_micro_batch_size_per_gpu"] = 2;
  const Config llama = ParseConfig(l);
  const std::vector<StepGemm> ls = StepGemmShapes(llama);
  const int64_t tokens = 2 * llama.data.seq_len, hd = llama.model.head_size();
  EXPECT_EQ(ls[0].shape.m, tokens);
  EXPECT_EQ(ls[0].shape.n, (llama.model.n_head + 2 * llama.model.kv_heads()) * hd);
  EXPECT_EQ(ls[6].linear, "mlp gate, up");
  EXPECT_EQ(ls[6].count, 2 * llama.model.n_layer);
  EXPECT_EQ(ls[6].shape.n, llama.model.mlp_hidden());
}

// Note [GEMMs chosen by measurement] for one process: the step's shapes of 0.1 GFLOP and more
// are measured once and cached where ZTRAIN_CACHE_DIR says, a second start reads the same
// choices back without measuring, ZTRAIN_FP32_GEMM set by hand measures nothing, and a model
// whose GEMMs are all small is left on OpenBLAS without a cache file.
TEST(TuneTest, StepGemmsAreMeasuredOnceAndCached) {
  if (!kernels::cpu::OneDnnBuiltIn()) GTEST_SKIP() << "this build has no oneDNN";
  const testing::TempDir dir("ztrain_tune_gemm");
  testing::ScopedEnv cache_dir("ZTRAIN_CACHE_DIR", dir.path().c_str()),
      by_hand("ZTRAIN_FP32_GEMM", nullptr);
  const std::string cache = dir.File("gemm-choices.json");
  nlohmann::json j = testing::TinyConfigJson(1, 256, 4, 11, 256);
  j["train_micro_batch_size_per_gpu"] = 1;  // 256 tokens: the MLP's shapes are 0.13 GFLOP
  const Config c = ParseConfig(j);
  std::vector<kernels::GemmShape> large;
  for (const StepGemm& g : StepGemmShapes(c)) {
    if (g.shape.flops() >= kernels::kMeasuredFlops) large.push_back(g.shape);
  }
  ASSERT_FALSE(large.empty());

  const kernels::GemmPlan first = ChooseStepGemms(c, nullptr);
  ASSERT_TRUE(std::filesystem::exists(cache));
  std::ifstream in(cache);
  const nlohmann::json file = nlohmann::json::parse(in);
  const nlohmann::json& mine = file.at("machines").at(kernels::GemmCacheKey());
  EXPECT_EQ(mine.size(), large.size());
  for (const kernels::GemmShape& s : large) {
    ASSERT_TRUE(mine.contains(s.ToString())) << s.ToString();
    EXPECT_EQ(mine[s.ToString()]["backend"], kernels::GemmBackendName(first.For(s)));
  }
  EXPECT_EQ(first.choices().size(), large.size());  // the small ones stay unnamed: OpenBLAS
  const auto written = std::filesystem::last_write_time(cache);
  EXPECT_EQ(ChooseStepGemms(c, nullptr), first);
  EXPECT_EQ(std::filesystem::last_write_time(cache), written) << "the second start measured";

  std::filesystem::remove(cache);
  by_hand.Set("openblas");
  EXPECT_TRUE(ChooseStepGemms(c, nullptr).choices().empty());
  by_hand.Set(nullptr);
  EXPECT_TRUE(ChooseStepGemms(SmallConfig(), nullptr).choices().empty());
  EXPECT_FALSE(std::filesystem::exists(cache));
}

}  // namespace
}  // namespace ztrain
