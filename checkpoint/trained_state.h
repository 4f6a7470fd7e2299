#pragma once
// Note [Checkpoints in the engine]
// A checkpoint addresses every value by (parameter name, kind, element of the WHOLE
// parameter): the unsharded, unsplit tensor of the single-process model. Each element is
// saved by exactly one rank: the rank whose optimizer range holds it (at ZeRO stage 0 every
// dp rank holds everything, so dp rank 0), the tp rank 0 for parameters that tensor
// parallelism does not split (every tp rank holds them equal), and the owner's stage for a
// weight tied across pipeline stages (the other stage's copy is equal). A rank saves, for
// each parameter part in its optimizer range, the fp32 master values, Adam's m and v, with
// the part's local elements mapped to whole-parameter runs through its tensor-parallel slice
// (nn::ForEachSliceRun). Loading is the reverse for every element the rank holds in its own
// layout (its whole layers at ZeRO 0-2, its shard at 3; m and v for its optimizer range;
// a tied copy too), read from whichever rank file holds it, so dp size, ZeRO stage, offload,
// pp and tp may all differ between the saving and the loading run. The step counter is the
// only other engine state: gradients are zero between steps, the lr schedule is a function
// of the step. Swapped-out state streams through the stores a layer (parameters,
// offload::ParamStore) or a tile (optimizer state, through the sharded optimizer's walk) at a
// time. Frozen parameters are not saved: they come back from model.init_from, or from
// training.seed, as they came the first time (Note [Frozen regions]).
//
// SaveTrainedState and LoadTrainedState are that part: they read and write the rank's state
// through the parameter table (which elements, where), the parameter store (the fp32 values)
// and the sharded optimizer (its parts, m and v). Neither is collective. The optimizer's
// pending steps must be applied first (Note [Deferred optimizer step]).
#include "checkpoint/checkpoint.h"
#include "offload/param_store.h"
#include "parallel/zero/param_table.h"
#include "parallel/zero/sharded_optimizer.h"

namespace ztrain::checkpoint {

// The rank's place, for which elements it saves.
struct SavingRank {
  bool sharded_optimizer = false;  // ZeRO stage >= 1: every dp rank saves its own range
  int dp_rank = 0;
  int tp_rank = 0;
};

// Appends the elements this rank is responsible for to `writer`.
void SaveTrainedState(const zero::ParamTable& table, offload::ParamStore& params,
                      zero::ShardedOptimizer& optimizer, const SavingRank& rank,
                      ShardWriter& writer);
// Sets every trained element this rank holds, in its own layout, from `index` (written by any
// layout), and refreshes the 16-bit copies. Throws ztrain::Error naming a parameter the
// checkpoint lacks or holds in another shape (another model).
void LoadTrainedState(const zero::ParamTable& table, offload::ParamStore& params,
                      zero::ShardedOptimizer& optimizer, const ModelIndex& index);

}  // namespace ztrain::checkpoint
