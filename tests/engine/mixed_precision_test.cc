// Mixed precision in the engine (Note [Mixed precision in the engine]): bf16 and fp16 runs
// track the fp32 run's loss curve, every ZeRO stage trains the same bf16 model, 16-bit
// gradient accumulation works, fp16 skips overflowing steps and recovers, the scaler's state
// survives a checkpoint, and activations take half the memory.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "nn/gpt2.h"
#include "side_by_side.h"
#include "test_model.h"

namespace ztrain {
namespace {

struct Recipe {
  std::string precision = "fp32";  // "fp32", "bf16" or "fp16"
  int stage = 0;
  std::string grad_accum = "";  // data_types.grad_accum_dtype, "" = the default
  int initial_scale_power = 16;
};

Config MakeConfig(const Recipe& run) {
  nlohmann::json j = testing::TinyConfigJson(2, 32, 4, 11, 8);
  j["train_micro_batch_size_per_gpu"] = 4;
  j["gradient_accumulation_steps"] = 2;
  j.erase("train_batch_size");
  j["gradient_clipping"] = 1.0;
  j["optimizer"]["params"]["lr"] = 3e-3;
  j["optimizer"]["params"]["weight_decay"] = 0.1;
  j["zero_optimization"] = {{"stage", run.stage}};
  if (run.precision == "bf16") j["bf16"] = {{"enabled", true}};
  if (run.precision == "fp16") {
    j["fp16"] = {{"enabled", true}, {"initial_scale_power", run.initial_scale_power}};
  }
  if (!run.grad_accum.empty()) j["data_types"] = {{"grad_accum_dtype", run.grad_accum}};
  return ParseConfig(j);
}

Engine MakeEngine(const Recipe& run) {
  const Config config = MakeConfig(run);
  return Engine(config, nn::BuildGpt2(config.model));
}

// `steps` steps on a fixed stream of batches (a learnable pattern: targets are the tokens
// shifted by one in a repeating sequence, so the loss falls well below log(11)).
std::vector<StepStats> Train(Engine& e, int steps, int first_step = 0) {
  std::vector<StepStats> out;
  for (int s = first_step; s < first_step + steps; ++s) {
    std::vector<testing::OwnedBatch> owned;
    std::vector<nn::MicroBatch> micro;
    for (int m = 0; m < 2; ++m) {
      testing::OwnedBatch& b = owned.emplace_back(4, 8, 11, 1000 * s + m);
      for (size_t i = 0; i < b.tokens.size(); ++i) {
        b.targets[i] = (b.tokens[i] * 3 + 1) % 11;  // a function of the token: learnable
      }
      micro.push_back(b.mb);
    }
    out.push_back(e.TrainStep(micro));
  }
  return out;
}

// The largest and the mean relative difference of the losses over steps [from, end).
std::pair<double, double> LossGap(const std::vector<StepStats>& a, const std::vector<StepStats>& b,
                                  size_t from) {
  double worst = 0.0, sum = 0.0;
  for (size_t i = from; i < a.size(); ++i) {
    const double d = std::fabs(a[i].loss - b[i].loss) / b[i].loss;
    worst = std::max(worst, d);
    sum += d;
  }
  return {worst, sum / static_cast<double>(a.size() - from)};
}

// The stated tolerance of a 16-bit run against fp32 over 200 steps: every step's loss within
// 10 %, and within 3 % on average; and both runs learn (the loss halves).
void ExpectTracksFp32(const Recipe& run) {
  Engine reference = MakeEngine(Recipe{});
  Engine mixed = MakeEngine(run);
  const std::vector<StepStats> want = Train(reference, 200);
  const std::vector<StepStats> got = Train(mixed, 200);
  const auto [worst, mean] = LossGap(got, want, 0);
  EXPECT_LT(worst, 0.10) << run.precision;
  EXPECT_LT(mean, 0.03) << run.precision;
  EXPECT_LT(got.back().loss, 0.5 * got.front().loss) << run.precision;
  EXPECT_LT(want.back().loss, 0.5 * want.front().loss);
  std::printf(
      "%s vs fp32 over 200 steps: worst %.4f, mean %.4f relative; final loss %.4f vs "
      "%.4f\n",
      run.precision.c_str(), worst, mean, got.back().loss, want.back().loss);
}

TEST(MixedPrecisionTest, Bf16TracksFp32) { ExpectTracksFp32(Recipe{"bf16"}); }

TEST(MixedPrecisionTest, Fp16TracksFp32) {
  Recipe run{"fp16"};
  ExpectTracksFp32(run);
}

TEST(MixedPrecisionTest, Bf16GradientsAccumulateInBf16AndTrack) {
  ExpectTracksFp32(Recipe{"bf16", 0, "bf16"});
}

// The equivalence rule in bf16: every ZeRO stage (one process) trains the stage-0 model.
// With bf16 gradient accumulation, stages 0 and 1 sum the micro-batches in bf16 before the
// reduction, while stages 2 and 3 reduce each micro-batch as it comes and sum in fp32: each
// pair does the same arithmetic in the same order and has the same losses bit for bit (the
// gradient norm sums its squares shard by shard), and the two pairs agree within Note
// [Equivalence tolerances] for bf16 (10 steps of 64 tokens).
void ExpectSameLosses(const std::vector<StepStats>& got, const std::vector<StepStats>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].loss, want[i].loss) << what << " step " << i;
  }
}

TEST(MixedPrecisionTest, EveryZeroStageTrainsTheSameBf16Model) {
  std::vector<StepStats> fp32_accum[4], bf16_accum[4];
  for (int stage = 0; stage <= 3; ++stage) {
    Engine a = MakeEngine(Recipe{"bf16", stage});
    fp32_accum[stage] = Train(a, 10);
    Engine b = MakeEngine(Recipe{"bf16", stage, "bf16"});
    bf16_accum[stage] = Train(b, 10);
  }
  for (int stage = 1; stage <= 3; ++stage) {
    ExpectSameLosses(fp32_accum[stage], fp32_accum[0],
                     "stage " + std::to_string(stage) + ", fp32 accumulation");
  }
  ExpectSameLosses(bf16_accum[1], bf16_accum[0], "stage 1, bf16 accumulation");
  ExpectSameLosses(bf16_accum[3], bf16_accum[2], "stage 3, bf16 accumulation");
  const Config config = MakeConfig(Recipe{"bf16", 0, "bf16"});
  const int64_t params = MakeEngine(Recipe{"bf16"}).NumParameters();
  testing::EquivalenceCheck check(testing::ModelFor(config, params, 2 * 4 * 8, 10),
                                  config.model.n_embd);
  double lr_sum = 0.0;
  for (size_t i = 0; i < bf16_accum[0].size(); ++i) {
    const StepStats &got = bf16_accum[2][i], &want = bf16_accum[0][i];
    check.Step(want.step, got.loss, want.loss, got.grad_norm, want.grad_norm, lr_sum);
    lr_sum += want.lr;
  }
  testing::ExpectWithinRounding(check, "stage 2 against 0, bf16 accumulation");
}

TEST(MixedPrecisionTest, Fp16SkipsOverflowingStepsAndRecovers) {
  // 2^40 overflows fp16 at once: the scale halves every second overflow (hysteresis 2) until
  // the gradients fit, the skipped steps take no update, and training then goes on.
  Engine e = MakeEngine(Recipe{"fp16", 0, "", 40});
  const std::vector<StepStats> s = Train(e, 60);
  ASSERT_TRUE(s.front().skipped);
  EXPECT_EQ(s.front().loss_scale, std::ldexp(1.0, 40));
  int64_t skipped = 0;
  size_t first_update = s.size();
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i].step, static_cast<int64_t>(i) + 1) << "a skipped step still counts";
    if (s[i].skipped) {
      ++skipped;
    } else if (first_update == s.size()) {
      first_update = i;
    }
    EXPECT_EQ(s[i].skipped_steps, skipped);
  }
  ASSERT_LT(first_update, s.size()) << "never recovered";
  EXPECT_GE(skipped, 2);
  EXPECT_LT(s[first_update].loss_scale, std::ldexp(1.0, 40));
  EXPECT_LE(s[first_update].loss_scale, 65504.0 * 16);
  // The updates taken make the same model as a run that started at the scale that fits.
  EXPECT_LT(s.back().loss, s[first_update].loss);
}

TEST(MixedPrecisionTest, TheLossScalerStateGoesIntoCheckpoints) {
  Engine a = MakeEngine(Recipe{"fp16", 0, "", 40});
  const std::vector<StepStats> before = Train(a, 6);
  const nlohmann::json state = a.LossScalerState();
  ASSERT_FALSE(state.is_null());
  // Restored into a fresh engine, the next step runs at the scale the first engine's next
  // step runs at, with the skipped count carried on.
  Engine b = MakeEngine(Recipe{"fp16", 0, "", 40});
  b.RestoreLossScaler(state);
  const StepStats next_a = Train(a, 1, 6).front();
  const StepStats next_b = Train(b, 1, 6).front();
  EXPECT_EQ(next_b.loss_scale, next_a.loss_scale);
  EXPECT_LT(next_b.loss_scale, std::ldexp(1.0, 40));
  EXPECT_GE(next_b.skipped_steps, before.back().skipped_steps);
  // Without fp16 there is no state, and a null state leaves the scaler as configured.
  EXPECT_TRUE(MakeEngine(Recipe{"bf16"}).LossScalerState().is_null());
  Engine c = MakeEngine(Recipe{"fp16", 0, "", 40});
  c.RestoreLossScaler(nlohmann::json());
  EXPECT_EQ(Train(c, 1).front().loss_scale, std::ldexp(1.0, 40));
}

TEST(MixedPrecisionTest, Bf16ActivationsTakeHalfTheMemory) {
  Engine fp32 = MakeEngine(Recipe{});
  Engine bf16 = MakeEngine(Recipe{"bf16"});
  Train(fp32, 1);
  Train(bf16, 1);
  const double a = static_cast<double>(fp32.memory().Peak(MemoryCategory::kActivations));
  const double b = static_cast<double>(bf16.memory().Peak(MemoryCategory::kActivations));
  // Everything but the fp32 statistics, lse and losses halves.
  EXPECT_LT(b, 0.62 * a);
  EXPECT_GT(b, 0.45 * a);
  // The parameters: fp32 master + the bf16 copy = 1.5x.
  const double pa = static_cast<double>(fp32.memory().Current(MemoryCategory::kParameters));
  const double pb = static_cast<double>(bf16.memory().Current(MemoryCategory::kParameters));
  EXPECT_NEAR(pb, 1.5 * pa, 0.01 * pa);
}

TEST(MixedPrecisionTest, WholeParametersAreTheFp32Masters) {
  Engine e = MakeEngine(Recipe{"bf16"});
  Train(e, 3);
  bool some_not_bf16 = false;
  e.ForEachFullParameter([&](const std::string&, const Tensor& t) {
    ASSERT_EQ(t.dtype(), DType::kF32);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float x = t.data<float>()[i];
      some_not_bf16 |= Bf16ToFloat(FloatToBf16(x)) != x;
    }
  });
  EXPECT_TRUE(some_not_bf16) << "the masters carry more than bf16 precision";
}

}  // namespace
}  // namespace ztrain
