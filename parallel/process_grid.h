#pragma once
// ProcessGrid: the dp × cp × pp × tp layout of ranks, in Megatron's order (tp fastest, then cp,
// then dp, then pp): rank = ((pp * dp_size + dp) * cp_size + cp) * tp_size + tp. So the tp
// group of a rank is a run of consecutive ranks (the ones that share a node's fast links), the
// cp group (context parallelism: the ranks splitting each sequence) strides by tp_size, dp
// groups by cp_size * tp_size, and pp groups by dp_size * cp_size * tp_size. The gradients of
// a context-parallel layout are reduced over the dp x cp group (Note [Context parallelism] in
// nn/context_parallel.h).
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
  int cp = 0;
  bool operator==(const GridCoord&) const = default;
};

class ProcessGrid {
 public:
  ProcessGrid(int world, int dp, int pp, int tp, int cp = 1);

  int world() const { return dp_ * cp_ * pp_ * tp_; }
  int dp_size() const { return dp_; }
  int pp_size() const { return pp_; }
  int tp_size() const { return tp_; }
  int cp_size() const { return cp_; }

  GridCoord Coord(int rank) const;
  int Rank(GridCoord coord) const;
  // The world ranks of `rank`'s group, in group-rank order (the coordinate along the axis;
  // for the dp x cp group, dp * cp_size + cp).
  std::vector<int> DpGroup(int rank) const;
  std::vector<int> PpGroup(int rank) const;
  std::vector<int> TpGroup(int rank) const;
  std::vector<int> CpGroup(int rank) const;
  std::vector<int> DpCpGroup(int rank) const;

 private:
  int dp_, pp_, tp_, cp_;
};

// This rank's sub-communicators of the grid, labelled "dp group", "pp group", "tp group" and,
// with context parallelism, "cp group" and "dp x cp group".
struct GridCommunicators {
  std::unique_ptr<comm::Communicator> dp;
  std::unique_ptr<comm::Communicator> pp;
  std::unique_ptr<comm::Communicator> tp;
  std::unique_ptr<comm::Communicator> cp;     // null when cp_size is 1
  std::unique_ptr<comm::Communicator> dp_cp;  // null when cp_size is 1
  // The group the gradients (and ZeRO's shards) are reduced over: dp x cp, or dp.
  comm::Communicator& gradients() const { return dp_cp ? *dp_cp : *dp; }
};

// Splits `world` (whose size must be grid.world()) into the groups. Collective: every rank of
// `world` calls it. Throws Error on a size mismatch, CommError from the splits.
GridCommunicators MakeGridCommunicators(comm::Communicator& world, const ProcessGrid& grid);

}  // namespace ztrain
