#pragma once
// ProcessGrid: the dp × pp × tp layout of ranks, in Megatron's order (tp fastest, then dp,
// then pp): rank = (pp * dp_size + dp) * tp_size + tp. So the tp group of a rank is a run of
// consecutive ranks (the ones that share a node's fast links), dp groups stride by tp_size,
// and pp groups stride by dp_size * tp_size.
//
// A plain value type; thread safe. The constructor throws ztrain::Error when the sizes do
// not multiply to the world size; Coord/Rank/the groups assert their arguments.
#include <memory>
#include <vector>

#include "parallel/comm/communicator.h"

namespace ztrain {

struct GridCoord {
  int dp = 0;
  int pp = 0;
  int tp = 0;
  bool operator==(const GridCoord&) const = default;
};

class ProcessGrid {
 public:
  ProcessGrid(int world, int dp, int pp, int tp);

  int world() const { return dp_ * pp_ * tp_; }
  int dp_size() const { return dp_; }
  int pp_size() const { return pp_; }
  int tp_size() const { return tp_; }

  GridCoord Coord(int rank) const;
  int Rank(GridCoord coord) const;
  // The world ranks of `rank`'s group, in group-rank order (the coordinate along the axis).
  std::vector<int> DpGroup(int rank) const;
  std::vector<int> PpGroup(int rank) const;
  std::vector<int> TpGroup(int rank) const;

 private:
  int dp_, pp_, tp_;
};

// This rank's sub-communicators of the grid, labelled "dp group", "pp group", "tp group".
struct GridCommunicators {
  std::unique_ptr<comm::Communicator> dp;
  std::unique_ptr<comm::Communicator> pp;
  std::unique_ptr<comm::Communicator> tp;
};

// Splits `world` (whose size must be grid.world()) into the three groups. Collective: every
// rank of `world` calls it. Throws Error on a size mismatch, CommError from the splits.
GridCommunicators MakeGridCommunicators(comm::Communicator& world, const ProcessGrid& grid);

}  // namespace ztrain
