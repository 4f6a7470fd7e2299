#include "parallel/zero/stage_policy.h"

#include "core/error.h"

namespace ztrain::zero {

StagePolicy StagePolicyFor(int stage, bool reduce_scatter) {
  ZTRAIN_CHECK_T(ConfigError, stage >= 0 && stage <= 3, "zero_optimization.stage is ", stage,
                 "; use 0, 1, 2 or 3");
  StagePolicy p;
  p.stage = stage;
  p.shard_optimizer = stage >= 1;
  p.shard_gradients = stage >= 2;
  p.shard_parameters = stage == 3;
  p.gather_after_step = stage == 1 || stage == 2;
  p.reduce = ReducePolicyFor(stage, reduce_scatter);
  return p;
}

}  // namespace ztrain::zero
