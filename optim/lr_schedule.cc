#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "core/error.h"

namespace ztrain::optim {
namespace {

// The warmup part shared by the three DeepSpeed schedules: DeepSpeed uses
// max(2, warmup_num_steps) so that log(steps) > 0 (0 is what an HF Trainer config's "auto"
// gives).
class Warmup {
 public:
  explicit Warmup(const SchedulerConfig& c) {
    ZTRAIN_CHECK_T(ConfigError, c.warmup_num_steps >= 0,
                   "scheduler.params.warmup_num_steps must be >= 0, got ",
                   c.warmup_num_steps);
    ZTRAIN_CHECK_T(ConfigError, c.warmup_type == "log" || c.warmup_type == "linear",
                   "scheduler.params.warmup_type must be \"log\" or \"linear\", got \"",
                   c.warmup_type, "\"");
    steps_ = std::max<int64_t>(2, c.warmup_num_steps);
    log_ = c.warmup_type == "log";
    inverse_log_ = 1.0 / std::log(static_cast<double>(steps_));
  }
  int64_t steps() const { return steps_; }
  bool InWarmup(int64_t iteration) const { return iteration < steps_; }
  // 0 at iteration 0, approaching 1 at iteration steps() (DeepSpeed's _get_gamma warmup).
  double Gamma(int64_t iteration) const {
    return log_ ? inverse_log_ * std::log(static_cast<double>(iteration) + 1.0)
                : static_cast<double>(iteration) / static_cast<double>(steps_);
  }

 private:
  int64_t steps_;
  bool log_;
  double inverse_log_;
};

void CheckTotalSteps(const SchedulerConfig& c) {
  ZTRAIN_CHECK_T(ConfigError, c.total_num_steps > 0,
                 "scheduler.params.total_num_steps must be > 0 for ", c.type,
                 " (usually the number of training steps), got ", c.total_num_steps);
}

class ConstantLr final : public LrSchedule {
 public:
  explicit ConstantLr(double lr) : lr_(lr) {}
  double LrAt(int64_t) const override { return lr_; }
  const char* name() const override { return "constant"; }

 private:
  double lr_;
};

// WarmupLR, and WarmupDecayLR when `decay` (both are one class in DeepSpeed too).
class WarmupLr final : public LrSchedule {
 public:
  WarmupLr(const SchedulerConfig& c, bool decay)
      : warmup_(c),
        min_lr_(c.warmup_min_lr),
        delta_lr_(c.warmup_max_lr - c.warmup_min_lr),
        total_steps_(c.total_num_steps),
        decay_(decay) {
    if (decay) CheckTotalSteps(c);
  }
  double LrAt(int64_t step) const override {
    const int64_t iteration = step - 1;  // Note [LR schedule step index]
    if (iteration < 0) return min_lr_;
    return min_lr_ + delta_lr_ * Gamma(iteration);
  }
  const char* name() const override { return decay_ ? "WarmupDecayLR" : "WarmupLR"; }

 private:
  double Gamma(int64_t iteration) const {
    if (warmup_.InWarmup(iteration)) return warmup_.Gamma(iteration);
    if (!decay_) return 1.0;
    const double remaining = static_cast<double>(total_steps_ - iteration);
    const double span = std::max<double>(1.0, static_cast<double>(total_steps_ - warmup_.steps()));
    return std::max(0.0, remaining / span);
  }

  Warmup warmup_;
  double min_lr_, delta_lr_;
  int64_t total_steps_;
  bool decay_;
};

class WarmupCosineLr final : public LrSchedule {
 public:
  WarmupCosineLr(const SchedulerConfig& c, double optimizer_lr)
      : warmup_(c),
        lr_(optimizer_lr),
        warmup_min_ratio_(c.warmup_min_ratio),
        cos_min_ratio_(c.cos_min_ratio),
        total_steps_(c.total_num_steps) {
    CheckTotalSteps(c);
  }
  double LrAt(int64_t step) const override {
    const int64_t iteration = step - 1;  // Note [LR schedule step index]
    if (iteration < 0) return 0.0;       // DeepSpeed's get_lr() before the first step()
    return lr_ * Ratio(iteration);
  }
  const char* name() const override { return "WarmupCosineLR"; }

 private:
  // DeepSpeed's get_lr_ratio(). Current DeepSpeed clamps the cosine progress to 1 (older
  // releases let the ratio swing back up past total_num_steps) and floors the span at 1.
  double Ratio(int64_t iteration) const {
    if (warmup_.InWarmup(iteration)) {
      return warmup_min_ratio_ + warmup_.Gamma(iteration) * (1.0 - warmup_min_ratio_);
    }
    const double real_last_step = static_cast<double>(iteration - warmup_.steps() + 1);
    const double real_total_steps =
        static_cast<double>(std::max<int64_t>(1, total_steps_ - warmup_.steps()));
    const double progress = std::min(1.0, real_last_step / real_total_steps);
    const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    return std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * cosine);
  }

  Warmup warmup_;
  double lr_, warmup_min_ratio_, cos_min_ratio_;
  int64_t total_steps_;
};

}  // namespace

std::unique_ptr<LrSchedule> MakeLrSchedule(const SchedulerConfig& config, double optimizer_lr) {
  if (config.type.empty()) return std::make_unique<ConstantLr>(optimizer_lr);
  if (config.type == "WarmupLR") return std::make_unique<WarmupLr>(config, /*decay=*/false);
  if (config.type == "WarmupDecayLR") return std::make_unique<WarmupLr>(config, /*decay=*/true);
  if (config.type == "WarmupCosineLR")
    return std::make_unique<WarmupCosineLr>(config, optimizer_lr);
  throw ConfigError("scheduler.type \"" + config.type +
                    "\" is not supported; use WarmupLR, WarmupDecayLR, WarmupCosineLR, or no "
                    "scheduler section for a constant lr (LRRangeTest and OneCycle are not "
                    "implemented)");
}

}  // namespace ztrain::optim
