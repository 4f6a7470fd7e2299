#pragma once
// Note [ZeRO stage policy]
// What a ZeRO stage shards, decided once from zero_optimization.stage: the flags the engine
// builds its parts from (the flat layout, the gradient reducer, the parameter gatherer, the
// sharded optimizer, its buffers), so that nothing past construction asks which stage runs.
//   stage  shard_optimizer  shard_gradients  shard_parameters  gather_after_step
//     0         -                -                 -                 -
//     1         x                -                 -                 x
//     2         x                x                 -                 x
//     3         x                x                 x                 -
// shard_optimizer: m, v and the fp32 master cover the rank's shard (FlatLayout's optimizer
//   range), the norm is summed over dp, and every rank saves its own part of a checkpoint;
// shard_gradients: a layer's full gradients exist only from its backward until its bucket is
//   reduce-scattered, every micro-batch reduces into the rank's shard, which accumulates;
// shard_parameters: the rank holds only its parameter shard; layers are gathered to run;
// gather_after_step: the updated shards are all-gathered back into the whole parameters.
// Without shard_optimizer gradients are all-reduced behind the last micro-batch's backward,
// always overlapped.
#include "parallel/zero/gradient_reducer.h"

namespace ztrain::zero {

struct StagePolicy {
  int stage = 0;
  bool shard_optimizer = false;
  bool shard_gradients = false;
  bool shard_parameters = false;
  bool gather_after_step = false;
  ReducePolicy reduce = ReducePolicy::kAllReduce;  // with zero_optimization.reduce_scatter
};

// Throws ConfigError for a stage other than 0, 1, 2 or 3.
StagePolicy StagePolicyFor(int stage, bool reduce_scatter);

}  // namespace ztrain::zero
