#include "parallel/process_grid.h"

#include "core/error.h"

namespace ztrain {

ProcessGrid::ProcessGrid(int world, int dp, int pp, int tp) : dp_(dp), pp_(pp), tp_(tp) {
  ZTRAIN_CHECK(dp >= 1 && pp >= 1 && tp >= 1, "process grid sizes must be at least 1, got dp=", dp,
               " pp=", pp, " tp=", tp);
  ZTRAIN_CHECK(world == dp * pp * tp, "the process grid dp=", dp, " x pp=", pp, " x tp=", tp,
               " has ", dp * pp * tp, " ranks but the job has ", world,
               "; choose pipeline and tensor parallel sizes whose product divides the world "
               "size (dp is world / (pp * tp))");
}

GridCoord ProcessGrid::Coord(int rank) const {
  ZTRAIN_ASSERT(rank >= 0 && rank < world(), "rank ", rank, " of ", world());
  return {(rank / tp_) % dp_, rank / (tp_ * dp_), rank % tp_};
}

int ProcessGrid::Rank(GridCoord c) const {
  ZTRAIN_ASSERT(c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_ && c.tp >= 0 && c.tp < tp_);
  return (c.pp * dp_ + c.dp) * tp_ + c.tp;
}

std::vector<int> ProcessGrid::DpGroup(int rank) const {
  GridCoord c = Coord(rank);
  std::vector<int> ranks;
  for (c.dp = 0; c.dp < dp_; ++c.dp) ranks.push_back(Rank(c));
  return ranks;
}

std::vector<int> ProcessGrid::PpGroup(int rank) const {
  GridCoord c = Coord(rank);
  std::vector<int> ranks;
  for (c.pp = 0; c.pp < pp_; ++c.pp) ranks.push_back(Rank(c));
  return ranks;
}

std::vector<int> ProcessGrid::TpGroup(int rank) const {
  GridCoord c = Coord(rank);
  std::vector<int> ranks;
  for (c.tp = 0; c.tp < tp_; ++c.tp) ranks.push_back(Rank(c));
  return ranks;
}

GridCommunicators MakeGridCommunicators(comm::Communicator& world, const ProcessGrid& grid) {
  ZTRAIN_CHECK(world.size() == grid.world(), "the process grid has ", grid.world(), " ranks but ",
               world.name(), " has ", world.size());
  const GridCoord c = grid.Coord(world.rank());
  // Ranks of one group share every other coordinate: that pair is the split color.
  GridCommunicators comms;
  comms.dp = world.Split(c.pp * grid.tp_size() + c.tp, c.dp);
  comms.pp = world.Split(c.dp * grid.tp_size() + c.tp, c.pp);
  comms.tp = world.Split(c.pp * grid.dp_size() + c.dp, c.tp);
  comms.dp->set_label("dp group");
  comms.pp->set_label("pp group");
  comms.tp->set_label("tp group");
  return comms;
}

}  // namespace ztrain
