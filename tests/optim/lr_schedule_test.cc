#include "optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "core/error.h"

namespace ztrain::optim {
namespace {

// Expected values come from a line-by-line Python transcription of DeepSpeed's
// lr_schedules.py classes, driven as the engine drives them (the lr in the param group when
// optimizer.step() number k runs, then scheduler.step()). Each is also derivable by hand;
// the comments show the formula at iteration k - 1 (Note [LR schedule step index]).
using Expected = std::vector<std::pair<int64_t, double>>;

void ExpectLrs(const LrSchedule& schedule, const Expected& expected) {
  for (const auto& [step, lr] : expected) {
    EXPECT_NEAR(schedule.LrAt(step), lr, 1e-15 + 1e-12 * lr) << schedule.name() << " step " << step;
  }
}

SchedulerConfig Config(const char* type) {
  SchedulerConfig c;
  c.type = type;
  return c;
}

TEST(LrScheduleTest, NoSchedulerIsTheOptimizerLr) {
  auto schedule = MakeLrSchedule(SchedulerConfig{}, 3e-4);
  EXPECT_STREQ(schedule->name(), "constant");
  ExpectLrs(*schedule, {{0, 3e-4}, {1, 3e-4}, {100000, 3e-4}});
}

TEST(LrScheduleTest, WarmupLrLogWithDeepSpeedDefaults) {
  // min 0, max 1e-3, 1000 steps, log: lr = 1e-3 * ln(k) / ln(1000) for 1 <= k <= 1000.
  auto schedule = MakeLrSchedule(Config("WarmupLR"), 0.5);  // optimizer lr is ignored
  ExpectLrs(*schedule, {{0, 0.0},
                        {1, 0.0},                     // ln(1) = 0
                        {2, 0.00010034333188799373},  // ln 2 / ln 1000
                        {3, 0.0001590404182398875},
                        {500, 0.0008996566681120063},
                        {999, 0.0009998551627419942},
                        {1000, 0.001},  // iteration 999: ln 1000 / ln 1000
                        {1001, 0.001},
                        {1100, 0.001}});
}

TEST(LrScheduleTest, WarmupLrLinear) {
  SchedulerConfig c = Config("WarmupLR");
  c.warmup_min_lr = 1e-4;
  c.warmup_max_lr = 1e-3;
  c.warmup_num_steps = 10;
  c.warmup_type = "linear";
  // lr = 1e-4 + 9e-4 * (k - 1) / 10 during warmup.
  ExpectLrs(*MakeLrSchedule(c, 5.0), {{0, 1e-4},
                                      {1, 1e-4},
                                      {2, 0.00019},
                                      {6, 0.00055},
                                      {10, 0.00091},
                                      {11, 0.001},
                                      {12, 0.001},
                                      {19, 0.001}});
}

TEST(LrScheduleTest, WarmupOfOneStepIsTreatedAsTwo) {
  SchedulerConfig c = Config("WarmupLR");
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 1.0;
  c.warmup_num_steps = 1;  // DeepSpeed: max(2, warmup_num_steps)
  c.warmup_type = "linear";
  ExpectLrs(*MakeLrSchedule(c, 5.0), {{0, 0.0}, {1, 0.0}, {2, 0.5}, {3, 1.0}, {4, 1.0}});
}

TEST(LrScheduleTest, WarmupDecayLrLinear) {
  SchedulerConfig c = Config("WarmupDecayLR");
  c.warmup_max_lr = 2e-3;
  c.warmup_num_steps = 10;
  c.warmup_type = "linear";
  c.total_num_steps = 30;
  // After warmup: 2e-3 * (30 - (k - 1)) / (30 - 10), floored at 0.
  ExpectLrs(*MakeLrSchedule(c, 5.0), {{0, 0.0},
                                      {1, 0.0},
                                      {5, 0.0008},
                                      {10, 0.0018},
                                      {11, 0.002},
                                      {12, 0.0019},
                                      {20, 0.0011},
                                      {30, 0.0001},
                                      {31, 0.0},
                                      {40, 0.0}});
}

TEST(LrScheduleTest, WarmupDecayLrLogDecaysToWarmupMinLr) {
  SchedulerConfig c = Config("WarmupDecayLR");
  c.warmup_min_lr = 1e-5;
  c.warmup_max_lr = 1e-3;
  c.warmup_num_steps = 20;
  c.total_num_steps = 100;
  // gamma decays to 0, so the lr ends at warmup_min_lr, not 0 (as in DeepSpeed).
  ExpectLrs(*MakeLrSchedule(c, 5.0), {{0, 1e-5},
                                      {1, 1e-5},
                                      {2, 0.00023906443102816158},
                                      {10, 0.0007709355689718385},
                                      {20, 0.001},
                                      {21, 0.001},
                                      {60, 0.0005173749999999999},
                                      {100, 2.2375000000000002e-05},
                                      {101, 1e-5},
                                      {110, 1e-5}});
}

TEST(LrScheduleTest, WarmupCosineLrLinear) {
  SchedulerConfig c = Config("WarmupCosineLR");
  c.warmup_num_steps = 10;
  c.warmup_type = "linear";
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.05;
  c.total_num_steps = 50;
  // Warmup ratio 0.1 + 0.9 * (k - 1) / 10; then 0.05 + 0.95 * (1 + cos(pi * (k - 10) / 40)) / 2.
  ExpectLrs(*MakeLrSchedule(c, 6e-4), {{0, 0.0},  // before DeepSpeed's first step(): 0
                                       {1, 6e-5},
                                       {2, 0.000114},
                                       {10, 0.000546},
                                       {11, 0.0005991214401139415},
                                       {12, 0.0005964911770696143},
                                       {30, 0.000315},
                                       {50, 3e-5},
                                       {51, 3e-5},
                                       {100, 3e-5}});
}

TEST(LrScheduleTest, WarmupCosineLrLogWithDefaults) {
  SchedulerConfig c = Config("WarmupCosineLR");
  c.warmup_num_steps = 100;
  c.total_num_steps = 1000;  // warmup_min_ratio 0, cos_min_ratio 1e-4 by default
  ExpectLrs(*MakeLrSchedule(c, 3e-4), {{0, 0.0},
                                       {1, 0.0},
                                       {2, 4.515449934959717e-05},
                                       {50, 0.00025484550065040277},
                                       {100, 0.0002999999999999999},
                                       {101, 0.0002999990862400537},
                                       {550, 0.00015001499999999998},
                                       {1000, 3e-08},
                                       {1001, 3e-08},
                                       {1050, 3e-08}});
}

TEST(LrScheduleTest, RejectsUnknownTypeAndBadParameters) {
  EXPECT_THROW(MakeLrSchedule(Config("OneCycle"), 1e-3), ConfigError);
  EXPECT_THROW(MakeLrSchedule(Config("warmuplr"), 1e-3), ConfigError);
  SchedulerConfig c = Config("WarmupLR");
  c.warmup_num_steps = -1;
  EXPECT_THROW(MakeLrSchedule(c, 1e-3), ConfigError);
  c = Config("WarmupLR");
  c.warmup_type = "exp";
  EXPECT_THROW(MakeLrSchedule(c, 1e-3), ConfigError);
  EXPECT_THROW(MakeLrSchedule(Config("WarmupDecayLR"), 1e-3), ConfigError);  // no total steps
  EXPECT_THROW(MakeLrSchedule(Config("WarmupCosineLR"), 1e-3), ConfigError);
}

}  // namespace
}  // namespace ztrain::optim
