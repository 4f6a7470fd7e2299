#include "parallel/process_grid.h"

#include "core/error.h"

namespace ztrain {

ProcessGrid::ProcessGrid(int world, int dp, int pp, int tp, int cp)
    : dp_(dp), pp_(pp), tp_(tp), cp_(cp) {
  ZTRAIN_CHECK(dp >= 1 && pp >= 1 && tp >= 1 && cp >= 1,
               "process grid sizes must be at least 1, got dp=", dp, " cp=", cp, " pp=", pp,
               " tp=", tp);
  ZTRAIN_CHECK(world == dp * cp * pp * tp, "the process grid dp=", dp, " x cp=", cp, " x pp=", pp,
               " x tp=", tp, " has ", dp * cp * pp * tp, " ranks but the job has ", world,
               "; choose pipeline, tensor and context parallel sizes whose product divides the "
               "world size (dp is world / (cp * pp * tp))");
}

GridCoord ProcessGrid::Coord(int rank) const {
  ZTRAIN_ASSERT(rank >= 0 && rank < world(), "rank ", rank, " of ", world());
  return {.dp = (rank / (tp_ * cp_)) % dp_,
          .pp = rank / (tp_ * cp_ * dp_),
          .tp = rank % tp_,
          .cp = (rank / tp_) % cp_};
}

int ProcessGrid::Rank(GridCoord c) const {
  ZTRAIN_ASSERT(c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_ && c.tp >= 0 && c.tp < tp_ &&
                c.cp >= 0 && c.cp < cp_);
  return ((c.pp * dp_ + c.dp) * cp_ + c.cp) * tp_ + c.tp;
}

namespace {

// The ranks whose coordinate `axis` runs over [0, size), the others being `rank`'s.
std::vector<int> Along(const ProcessGrid& grid, int rank, int GridCoord::*axis, int size) {
  GridCoord c = grid.Coord(rank);
  std::vector<int> ranks;
  for (c.*axis = 0; c.*axis < size; ++(c.*axis)) ranks.push_back(grid.Rank(c));
  return ranks;
}

}  // namespace

std::vector<int> ProcessGrid::DpGroup(int rank) const {
  return Along(*this, rank, &GridCoord::dp, dp_);
}
std::vector<int> ProcessGrid::PpGroup(int rank) const {
  return Along(*this, rank, &GridCoord::pp, pp_);
}
std::vector<int> ProcessGrid::TpGroup(int rank) const {
  return Along(*this, rank, &GridCoord::tp, tp_);
}
std::vector<int> ProcessGrid::CpGroup(int rank) const {
  return Along(*this, rank, &GridCoord::cp, cp_);
}

std::vector<int> ProcessGrid::DpCpGroup(int rank) const {
  std::vector<int> ranks;
  for (const int r : DpGroup(rank)) {
    const std::vector<int> cp = CpGroup(r);
    ranks.insert(ranks.end(), cp.begin(), cp.end());
  }
  return ranks;
}

GridCommunicators MakeGridCommunicators(comm::Communicator& world, const ProcessGrid& grid) {
  ZTRAIN_CHECK(world.size() == grid.world(), "the process grid has ", grid.world(), " ranks but ",
               world.name(), " has ", world.size());
  const GridCoord c = grid.Coord(world.rank());
  const int tp = grid.tp_size(), cp = grid.cp_size(), dp = grid.dp_size();
  // Ranks of one group share every other coordinate: those are the split color.
  GridCommunicators comms;
  comms.dp = world.Split((c.pp * cp + c.cp) * tp + c.tp, c.dp);
  comms.pp = world.Split((c.dp * cp + c.cp) * tp + c.tp, c.pp);
  comms.tp = world.Split((c.pp * dp + c.dp) * cp + c.cp, c.tp);
  comms.dp->set_label("dp group");
  comms.pp->set_label("pp group");
  comms.tp->set_label("tp group");
  if (cp > 1) {
    comms.cp = world.Split((c.pp * dp + c.dp) * tp + c.tp, c.cp);
    comms.dp_cp = world.Split(c.pp * tp + c.tp, c.dp * cp + c.cp);
    comms.cp->set_label("cp group");
    comms.dp_cp->set_label("dp x cp group");
  }
  return comms;
}

}  // namespace ztrain
