// Pipeline partitioning: uniform splits differ by at most one layer, parameter splits are the
// optimal (and earliest) contiguous splits found by brute force, and bad inputs are refused.
#include "parallel/pipeline/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "core/error.h"

namespace ztrain::pipeline {
namespace {

std::vector<int> Split(const std::vector<int64_t>& params, int stages, PartitionMethod method) {
  return PartitionLayers(params, stages, method);
}

int64_t LargestStage(const std::vector<int64_t>& params, const std::vector<int>& bounds) {
  int64_t largest = 0;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    int64_t sum = 0;
    for (int l = bounds[s]; l < bounds[s + 1]; ++l) sum += params[l];
    largest = std::max(largest, sum);
  }
  return largest;
}

// Every split into `stages` non-empty contiguous parts, boundaries in lexicographic order.
void ForEachSplit(int layers, int stages, const std::function<void(const std::vector<int>&)>& fn) {
  std::vector<int> bounds{0};
  std::function<void()> extend = [&] {
    const int s = static_cast<int>(bounds.size());
    if (s == stages) {
      bounds.push_back(layers);
      fn(bounds);
      bounds.pop_back();
      return;
    }
    for (int b = bounds.back() + 1; b <= layers - (stages - s); ++b) {
      bounds.push_back(b);
      extend();
      bounds.pop_back();
    }
  };
  extend();
}

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PipelinePartitionTest, UniformGivesTheExtraLayersToEarlierStages) {
  const std::vector<int64_t> ten(10, 1);
  EXPECT_EQ(Split(ten, 4, PartitionMethod::kUniform), (std::vector<int>{0, 3, 6, 8, 10}));
  EXPECT_EQ(Split(ten, 5, PartitionMethod::kUniform), (std::vector<int>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(Split(ten, 1, PartitionMethod::kUniform), (std::vector<int>{0, 10}));
  EXPECT_EQ(Split(ten, 10, PartitionMethod::kUniform),
            (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  for (int n = 1; n <= 20; ++n) {
    for (int p = 1; p <= n; ++p) {
      const std::vector<int> bounds =
          Split(std::vector<int64_t>(n, 7), p, PartitionMethod::kUniform);
      ASSERT_EQ(bounds.size(), static_cast<size_t>(p + 1));
      EXPECT_EQ(bounds.front(), 0);
      EXPECT_EQ(bounds.back(), n);
      for (int s = 0; s < p; ++s) {
        const int count = bounds[s + 1] - bounds[s];
        EXPECT_TRUE(count == n / p || count == n / p + 1) << "n=" << n << " p=" << p;
        if (s > 0) {
          EXPECT_LE(count, bounds[s] - bounds[s - 1]) << "n=" << n << " p=" << p;
        }
      }
    }
  }
}

TEST(PipelinePartitionTest, ParametersBalancesAGpt2LikeModel) {
  // Embedding and head of 39M parameters around 12 blocks of 7M.
  std::vector<int64_t> gpt2(14, 7'000'000);
  gpt2.front() = gpt2.back() = 39'000'000;
  // Embedding and head alone, six blocks per middle stage: 42M; uniform puts the head with
  // three blocks (60M).
  EXPECT_EQ(Split(gpt2, 4, PartitionMethod::kParameters), (std::vector<int>{0, 1, 7, 13, 14}));
  EXPECT_EQ(Split(gpt2, 4, PartitionMethod::kUniform), (std::vector<int>{0, 4, 8, 11, 14}));
  EXPECT_EQ(Split(gpt2, 2, PartitionMethod::kParameters), (std::vector<int>{0, 7, 14}));
  EXPECT_EQ(Split(gpt2, 1, PartitionMethod::kParameters), (std::vector<int>{0, 14}));
  EXPECT_EQ(Split(gpt2, 14, PartitionMethod::kParameters)[13], 13);
}

TEST(PipelinePartitionTest, ParametersBreaksTiesTowardEarlierBoundaries) {
  EXPECT_EQ(Split({5, 0, 0, 5}, 2, PartitionMethod::kParameters), (std::vector<int>{0, 1, 4}));
  EXPECT_EQ(Split({0, 0, 0, 0, 0}, 3, PartitionMethod::kParameters),
            (std::vector<int>{0, 1, 2, 5}));
  EXPECT_EQ(Split({1, 1, 1, 1, 1, 1}, 4, PartitionMethod::kParameters),
            (std::vector<int>{0, 1, 2, 4, 6}));
}

TEST(PipelinePartitionTest, ParametersMatchesBruteForceOnRandomModels) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 9);
    const int p = 1 + static_cast<int>(rng() % n);
    // Small values (zeros included) make ties common; some trials use large ones.
    const int64_t range = trial % 4 == 0 ? 1'000'000'000 : 6;
    std::vector<int64_t> params(n);
    for (int64_t& x : params) x = static_cast<int64_t>(rng() % range);

    std::vector<int> best;
    int64_t best_largest = 0;
    ForEachSplit(n, p, [&](const std::vector<int>& bounds) {
      const int64_t largest = LargestStage(params, bounds);
      if (best.empty() || largest < best_largest) {  // the first optimum is the earliest
        best = bounds;
        best_largest = largest;
      }
    });
    const std::vector<int> got = Split(params, p, PartitionMethod::kParameters);
    ::testing::Message model;
    for (int64_t x : params) model << x << ' ';
    EXPECT_EQ(LargestStage(params, got), best_largest) << "p=" << p << " params " << model;
    EXPECT_EQ(got, best) << "p=" << p << " params " << model;
  }
}

TEST(PipelinePartitionTest, RefusesMoreStagesThanLayers) {
  const std::vector<int64_t> six(6, 1);
  for (PartitionMethod method : {PartitionMethod::kUniform, PartitionMethod::kParameters}) {
    const std::string error = ErrorOf([&] { Split(six, 8, method); });
    EXPECT_NE(error.find("6 layers"), std::string::npos) << error;
    EXPECT_NE(error.find("pipeline.stages is 8"), std::string::npos) << error;
    EXPECT_THROW(Split(six, 0, method), Error);
    EXPECT_THROW(Split(six, -2, method), Error);
    EXPECT_THROW(Split({}, 1, method), Error);
  }
  EXPECT_THROW(Split({3, -1, 4}, 2, PartitionMethod::kParameters), Error);
}

TEST(PipelinePartitionTest, NamesParseAndUnknownNamesListTheAcceptedOnes) {
  for (PartitionMethod method : {PartitionMethod::kUniform, PartitionMethod::kParameters}) {
    EXPECT_EQ(ParsePartitionMethod(PartitionMethodName(method)), method);
  }
  EXPECT_EQ(ParsePartitionMethod("parameters"), PartitionMethod::kParameters);
  const std::string error = ErrorOf([] { ParsePartitionMethod("type:transformer"); });
  EXPECT_NE(error.find("\"type:transformer\""), std::string::npos) << error;
  EXPECT_NE(error.find("\"uniform\""), std::string::npos) << error;
  EXPECT_NE(error.find("\"parameters\""), std::string::npos) << error;
}

}  // namespace
}  // namespace ztrain::pipeline
