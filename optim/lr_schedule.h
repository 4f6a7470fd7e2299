#pragma once
// Learning-rate schedules with DeepSpeed's names, parameters and formulas
// (deepspeed/runtime/lr_schedules.py: WarmupLR, WarmupDecayLR, WarmupCosineLR).
//
// A schedule is a pure function of the step, immutable after construction and thread safe;
// there is no step() to call and nothing to checkpoint but the step count. MakeLrSchedule
// throws ztrain::ConfigError for an unknown type or invalid parameters.
//
// Note [LR schedule step index]
// DeepSpeed builds the scheduler with last_batch_iteration = -1, which already sets the
// optimizer's lr, and calls scheduler.step() after every optimizer step that was applied
// (not after steps skipped for fp16 overflow). So optimizer step k (0-based count of applied
// steps) runs with the lr that get_lr() gives for last_batch_iteration = k - 1:
//   k = 0: WarmupLR and WarmupDecayLR give warmup_min_lr; WarmupCosineLR gives 0.0
//          (its get_lr() returns 0 before the first step(), not warmup_min_ratio * lr);
//   k = 1: iteration 0, i.e. warmup_min_lr again under log warmup (log(1) = 0), and so on.
// LrAt(k) returns exactly that.
#include <cstdint>
#include <memory>

#include "core/config.h"

namespace ztrain::optim {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // The lr for optimizer step `step`: the number of steps applied before this one (0-based),
  // see Note [LR schedule step index].
  virtual double LrAt(int64_t step) const = 0;
  // DeepSpeed's type name ("WarmupLR", ...), or "constant" without a scheduler.
  virtual const char* name() const = 0;
};

// type "": the optimizer lr at every step. "WarmupLR": warmup_min_lr -> warmup_max_lr over
// warmup_num_steps ("log" or "linear"), then constant. "WarmupDecayLR": the same warmup, then
// linear decay to 0 at total_num_steps. "WarmupCosineLR": ratios of `optimizer_lr`, warmup
// from warmup_min_ratio to 1, then cosine down to cos_min_ratio at total_num_steps.
std::unique_ptr<LrSchedule> MakeLrSchedule(const SchedulerConfig& config, double optimizer_lr);

}  // namespace ztrain::optim
