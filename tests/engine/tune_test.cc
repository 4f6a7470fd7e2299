// The micro-batch tuner (engine/tune.h): the largest size the estimate fits in a budget,
// confirmed by a real step that measures within it; budgets too small; size parsing.
#include "engine/tune.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "engine/estimate.h"
#include "test_model.h"
#include "tests/expect_error.h"

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
