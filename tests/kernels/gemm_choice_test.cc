// Note [GEMMs chosen by measurement] (kernels/cpu/gemm_choice.h): the plan's text form, the
// margin oneDNN must win by, and the cache: measured once and read after, a hand-written entry
// obeyed, other machines' entries kept, a corrupt file replaced, an unusable path not an error.
#include "kernels/cpu/gemm_choice.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "kernel_test_util.h"
#include "kernels/cpu/onednn_matmul.h"
#include "tests/scoped_env.h"
#include "tests/temp_dir.h"

namespace ztrain::kernels {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ExpectErrorMentions;

using ztrain::testing::TempDir;

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Large enough to be measured (kMeasuredFlops), small enough to time in milliseconds.
constexpr GemmShape kLarge{false, true, 256, 512, 512};
constexpr GemmShape kSmall{true, false, 8, 8, 8};
constexpr GemmShape kLargeTn{true, false, 512, 512, 256};

TEST(GemmPlanTest, TextRoundTripsAndUnnamedShapesAreOpenBlas) {
  GemmPlan plan;
  plan.Choose(kLarge, GemmBackend::kOneDnn);
  plan.Choose(kSmall, GemmBackend::kOpenBlas);
  EXPECT_EQ(plan.ToText(), "NT 256x512x512 onednn;TN 8x8x8 openblas");
  EXPECT_EQ(GemmPlan::FromText(plan.ToText()), plan);
  EXPECT_EQ(GemmPlan::FromText(""), GemmPlan());
  EXPECT_EQ(plan.For(kLarge), GemmBackend::kOneDnn);
  EXPECT_EQ(plan.For({false, false, 256, 512, 512}), GemmBackend::kOpenBlas);  // transposes differ
  for (const char* bad : {"NX 1x2x3 onednn", "NT 1x2 onednn", "NT 1x2x3 mkl", "NT 0x2x3 onednn",
                          "NT 1x2x3 onednn trailing"}) {
    const std::string named = std::string("GEMM plan entry '") + bad + "'";
    ExpectErrorMentions([&] { GemmPlan::FromText(bad); }, {named.c_str(), "TT MxNxK backend"});
  }
}

TEST(GemmChoiceTest, OneDnnMustWinByTheMargin) {
  EXPECT_EQ(FasterBackend(100.0, 104.0), GemmBackend::kOpenBlas);  // within noise
  EXPECT_EQ(FasterBackend(100.0, 100.0 * kOneDnnPays), GemmBackend::kOneDnn);
  EXPECT_EQ(FasterBackend(100.0, 90.0), GemmBackend::kOpenBlas);
  EXPECT_EQ(FasterBackend(100.0, 0.0), GemmBackend::kOpenBlas);  // oneDNN has no such matmul
}

TEST(GemmChoiceTest, MeasuresOnceThenReadsTheCache) {
  if (!cpu::OneDnnBuiltIn()) GTEST_SKIP() << "this build has no oneDNN";
  TempDir dir;
  const std::string cache = dir.path() + "/sub/gemm-choices.json";  // the directory is created
  const GemmChoice first = ChooseFp32Gemms({{kLarge, 3}, {kSmall, 1}}, cache);
  EXPECT_EQ(first.measured, 1);
  EXPECT_EQ(first.cached, 0);
  EXPECT_EQ(first.small, 1);
  EXPECT_EQ(first.cache_problem, "");
  EXPECT_GT(first.openblas_seconds, 0.0);
  EXPECT_LE(first.plan_seconds, first.openblas_seconds);
  const json entry = ReadJson(cache)["machines"][GemmCacheKey()][kLarge.ToString()];
  ASSERT_TRUE(entry.is_object()) << ReadJson(cache).dump();
  EXPECT_EQ(entry["backend"], GemmBackendName(first.plan.For(kLarge)));
  EXPECT_EQ(FasterBackend(entry["openblas_gflops"], entry["onednn_gflops"]),
            first.plan.For(kLarge));
  EXPECT_EQ(first.plan.choices().count(kSmall), 0u);  // not measured, not named: OpenBLAS

  const GemmChoice second = ChooseFp32Gemms({{kLarge, 3}, {kSmall, 1}}, cache);
  EXPECT_EQ(second.measured, 0);
  EXPECT_EQ(second.cached, 1);
  EXPECT_EQ(second.plan, first.plan);
}

// What the cache says is what the plan takes, for this machine's key only; other machines'
// entries stay in the file when this one's are added.
TEST(GemmChoiceTest, TheCacheDecidesAndOtherMachinesAreKept) {
  if (!cpu::OneDnnBuiltIn()) GTEST_SKIP() << "this build has no oneDNN";
  TempDir dir;
  const std::string cache = dir.File("gemm-choices.json");
  const json other = {{kLarge.ToString(),
                       {{"backend", "onednn"}, {"openblas_gflops", 1.0}, {"onednn_gflops", 2.0}}}};
  // Rates no measurement here gives: the plan's figures come from the file, not a timing.
  const json mine = {
      {kLargeTn.ToString(),
       {{"backend", "onednn"}, {"openblas_gflops", 1.0}, {"onednn_gflops", 4.0}}},
      {kSmall.ToString(),  // an edited cache: a small shape stays on OpenBLAS all the same
       {{"backend", "onednn"}, {"openblas_gflops", 1.0}, {"onednn_gflops", 9.0}}}};
  WriteText(cache, json{{"format", "ztrain-gemm-choices"},
                        {"version", 1},
                        {"machines", {{"another machine", other}, {GemmCacheKey(), mine}}}}
                       .dump());
  const GemmChoice c = ChooseFp32Gemms({{kLargeTn, 2}, {kSmall, 1}, {kLarge, 1}}, cache);
  EXPECT_EQ(c.cached, 1);
  EXPECT_EQ(c.measured, 1);  // kLarge: another machine's entry is not this one's
  EXPECT_EQ(c.small, 1);
  EXPECT_EQ(c.plan.For(kLargeTn), GemmBackend::kOneDnn);
  EXPECT_EQ(c.plan.choices().count(kSmall), 0u);
  // kLargeTn twice a step at the file's 1 and 4 GFLOP/s: seconds no real timing comes near.
  const double large_tn = kLargeTn.flops() * 2 / 1e9;
  EXPECT_GE(c.openblas_seconds, large_tn / 1.0);
  EXPECT_GE(c.plan_seconds, large_tn / 4.0);
  EXPECT_LT(c.plan_seconds, large_tn / 2.0);
  const json file = ReadJson(cache);
  EXPECT_EQ(file["machines"]["another machine"], other);
  EXPECT_TRUE(file["machines"][GemmCacheKey()].contains(kLarge.ToString()));
  EXPECT_EQ(file["machines"][GemmCacheKey()][kLargeTn.ToString()], mine[kLargeTn.ToString()]);
  EXPECT_EQ(file["machines"][GemmCacheKey()][kSmall.ToString()], mine[kSmall.ToString()]);
}

TEST(GemmChoiceTest, ACorruptCacheIsMeasuredOverAndReplaced) {
  if (!cpu::OneDnnBuiltIn()) GTEST_SKIP() << "this build has no oneDNN";
  TempDir dir;
  const std::string cache = dir.File("gemm-choices.json");
  WriteText(cache, "{\"format\": \"ztrain-gemm-choices\", \"machines\": {");
  const GemmChoice c = ChooseFp32Gemms({{kLarge, 1}}, cache);
  EXPECT_NE(c.cache_problem.find("the GEMM choice cache " + cache + " does not read"),
            std::string::npos)
      << c.cache_problem;
  EXPECT_NE(c.cache_problem.find("measuring again and replacing it"), std::string::npos);
  EXPECT_EQ(c.measured, 1);
  EXPECT_TRUE(ReadJson(cache)["machines"][GemmCacheKey()].contains(kLarge.ToString()));
  // Edited by hand into JSON that is not an entry: this machine's entries not an object, an
  // entry without rates, oneDNN chosen at 0 GFLOP/s. Each is measured over, none divides by 0.
  for (const json& mine :
       {json("oneDNN please"), json{{kLarge.ToString(), {{"backend", "onednn"}}}},
        json{{kLarge.ToString(),
              {{"backend", "onednn"}, {"openblas_gflops", 1.0}, {"onednn_gflops", 0}}}}}) {
    WriteText(cache, json{{"format", "ztrain-gemm-choices"},
                          {"version", 1},
                          {"machines", {{GemmCacheKey(), mine}}}}
                         .dump());
    const GemmChoice e = ChooseFp32Gemms({{kLarge, 1}}, cache);
    EXPECT_EQ(e.measured, 1) << mine;
    EXPECT_TRUE(std::isfinite(e.plan_seconds) && e.plan_seconds > 0) << mine;
    EXPECT_TRUE(
        ReadJson(cache)["machines"][GemmCacheKey()][kLarge.ToString()].contains("onednn_gflops"))
        << mine;
  }
}

TEST(GemmChoiceTest, AnUnusableCachePathStillGivesAPlan) {
  if (!cpu::OneDnnBuiltIn()) GTEST_SKIP() << "this build has no oneDNN";
  TempDir dir;
  WriteText(dir.path() + "/file", "not a directory");
  const std::string cache = dir.path() + "/file/gemm-choices.json";
  const GemmChoice c = ChooseFp32Gemms({{kLarge, 1}}, cache);
  EXPECT_NE(c.cache_problem.find("cannot lock the GEMM choice cache"), std::string::npos)
      << c.cache_problem;
  EXPECT_EQ(c.measured, 1);
  EXPECT_EQ(c.plan.choices().count(kLarge), 1u);
}

TEST(GemmChoiceTest, TheCachePathFollowsTheEnvironment) {
  ztrain::testing::ScopedEnv dir("ZTRAIN_CACHE_DIR", nullptr), xdg("XDG_CACHE_HOME", nullptr),
      home("HOME", "/home/u");
  EXPECT_EQ(GemmCachePath(), "/home/u/.cache/ztrain/gemm-choices.json");
  xdg.Set("/xdg");
  EXPECT_EQ(GemmCachePath(), "/xdg/ztrain/gemm-choices.json");
  dir.Set("/z");
  EXPECT_EQ(GemmCachePath(), "/z/gemm-choices.json");
  dir.Set(nullptr);
  xdg.Set(nullptr);
  home.Set(nullptr);
  EXPECT_EQ(GemmCachePath(), "");
}

}  // namespace
}  // namespace ztrain::kernels
