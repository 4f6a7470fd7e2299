#include "parallel/process_grid.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ztrain {
namespace {

using Groups = std::vector<std::vector<int>>;

// Every distinct group along one axis, in order of first rank.
template <typename Fn>
Groups AllGroups(const ProcessGrid& grid, Fn group_of) {
  Groups groups;
  for (int r = 0; r < grid.world(); ++r) {
    auto g = group_of(r);
    if (g.front() == r) groups.push_back(g);
  }
  return groups;
}

// Megatron's documented example (megatron/core/parallel_state.py, initialize_model_parallel
// docstring): 16 GPUs, tensor parallel 2, pipeline 4, hence data parallel 2.
TEST(ProcessGridTest, MatchesMegatronDocumentedLayout) {
  const ProcessGrid grid(16, 2, 4, 2);
  EXPECT_EQ(AllGroups(grid, [&](int r) { return grid.DpGroup(r); }),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(AllGroups(grid, [&](int r) { return grid.TpGroup(r); }),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(AllGroups(grid, [&](int r) { return grid.PpGroup(r); }),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
}

// The same order at world 8 = 2 (dp) x 2 (pp) x 2 (tp).
TEST(ProcessGridTest, MatchesMegatronLayoutForEightRanks) {
  const ProcessGrid grid(8, 2, 2, 2);
  EXPECT_EQ(AllGroups(grid, [&](int r) { return grid.TpGroup(r); }),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(AllGroups(grid, [&](int r) { return grid.DpGroup(r); }),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(AllGroups(grid, [&](int r) { return grid.PpGroup(r); }),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(grid.Coord(6), (GridCoord{1, 1, 0}));
  EXPECT_EQ(grid.Coord(5), (GridCoord{0, 1, 1}));
}

TEST(ProcessGridTest, CoordAndRankAreInverse) {
  const ProcessGrid grid(24, 3, 2, 4);
  for (int r = 0; r < 24; ++r) {
    const GridCoord c = grid.Coord(r);
    EXPECT_EQ(grid.Rank(c), r);
    EXPECT_EQ(r, (c.pp * 3 + c.dp) * 4 + c.tp);  // tp fastest, then dp, then pp
    EXPECT_EQ(grid.DpGroup(r).at(c.dp), r);
    EXPECT_EQ(grid.PpGroup(r).at(c.pp), r);
    EXPECT_EQ(grid.TpGroup(r).at(c.tp), r);
  }
  EXPECT_EQ(grid.DpGroup(13), (std::vector<int>{13, 17, 21}));
}

// Context parallelism in Megatron's order "tp-cp-ep-dp-pp" (parallel_state.RankGenerator):
// 16 ranks of tp 2 x cp 2 x dp 2 x pp 2. The gradients' group is dp x cp.
TEST(ProcessGridTest, ContextParallelFollowsMegatronOrder) {
  const ProcessGrid grid(16, 2, 2, 2, 2);
  EXPECT_EQ(AllGroups(grid, [&](int r) { return grid.TpGroup(r); }),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(AllGroups(grid, [&](int r) { return grid.CpGroup(r); }),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(AllGroups(grid, [&](int r) { return grid.DpGroup(r); }),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(AllGroups(grid, [&](int r) { return grid.PpGroup(r); }),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(AllGroups(grid, [&](int r) { return grid.DpCpGroup(r); }),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  for (int r = 0; r < 16; ++r) {
    const GridCoord c = grid.Coord(r);
    EXPECT_EQ(grid.Rank(c), r);
    EXPECT_EQ(grid.CpGroup(r).at(c.cp), r);
    // The engine reads the data-parallel index and cp rank off its gradient-group rank.
    EXPECT_EQ(grid.DpCpGroup(r).at(c.dp * 2 + c.cp), r);
  }
  EXPECT_EQ(grid.Coord(6), (GridCoord{.dp = 1, .pp = 0, .tp = 0, .cp = 1}));
}

TEST(ProcessGridTest, PureDataParallel) {
  const ProcessGrid grid(4, 4, 1, 1);
  EXPECT_EQ(grid.DpGroup(2), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(grid.PpGroup(2), (std::vector<int>{2}));
  EXPECT_EQ(grid.TpGroup(2), (std::vector<int>{2}));
}

TEST(ProcessGridTest, RefusesSizesThatDoNotMultiplyToTheWorld) {
  try {
    ProcessGrid(8, 2, 3, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dp=2 x cp=1 x pp=3 x tp=1 has 6 ranks but the job has 8"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ProcessGrid(0, 0, 1, 1), Error);
}

TEST(ProcessGridTest, SelfWorldSplitsIntoGroupsOfOne) {
  auto world = comm::MakeSelfCommunicator();
  auto comms = MakeGridCommunicators(*world, ProcessGrid(1, 1, 1, 1));
  EXPECT_EQ(comms.dp->size(), 1);
  EXPECT_EQ(comms.dp->name(), "dp group of 1 (world ranks 0)");
  EXPECT_EQ(comms.tp->name(), "tp group of 1 (world ranks 0)");
  EXPECT_THROW(MakeGridCommunicators(*world, ProcessGrid(2, 2, 1, 1)), Error);
}

}  // namespace
}  // namespace ztrain
