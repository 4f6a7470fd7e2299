// Note [ZeRO stage policy]: the table, row by row, and a stage out of range.
#include "parallel/zero/stage_policy.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace ztrain::zero {
namespace {

TEST(StagePolicyTest, EachStageShardsWhatItsRowSays) {
  struct Row {
    bool optimizer, gradients, parameters, gather;
  };
  const Row rows[] = {{false, false, false, false},
                      {true, false, false, true},
                      {true, true, false, true},
                      {true, true, true, false}};
  for (int stage = 0; stage <= 3; ++stage) {
    const StagePolicy p = StagePolicyFor(stage, true);
    EXPECT_EQ(p.stage, stage);
    EXPECT_EQ(p.shard_optimizer, rows[stage].optimizer) << stage;
    EXPECT_EQ(p.shard_gradients, rows[stage].gradients) << stage;
    EXPECT_EQ(p.shard_parameters, rows[stage].parameters) << stage;
    EXPECT_EQ(p.gather_after_step, rows[stage].gather) << stage;
    EXPECT_EQ(p.reduce, ReducePolicyFor(stage, true)) << stage;
    EXPECT_EQ(StagePolicyFor(stage, false).reduce, ReducePolicyFor(stage, false)) << stage;
  }
}

TEST(StagePolicyTest, AStageOutOfRangeSaysWhichAreValid) {
  for (int stage : {-1, 4}) {
    try {
      StagePolicyFor(stage, true);
      FAIL() << stage;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("use 0, 1, 2 or 3"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace ztrain::zero
