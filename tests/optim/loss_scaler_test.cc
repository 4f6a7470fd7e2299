#include "optim/loss_scaler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../expect_error.h"
#include "core/error.h"

namespace ztrain::optim {
namespace {

using ztrain::testing::ExpectErrorWith;

// DeepSpeed's DynamicLossScaler (deepspeedai/DeepSpeed, deepspeed/runtime/fp16/loss_scaler.py),
// __init__ and update_scale transliterated line by line, logging left out, with
// raise_error_at_min_scale=False (ztrain does not raise at the minimum scale).
struct DeepSpeedDynamicLossScaler {
  double cur_scale;
  int64_t cur_iter = 0;
  int64_t last_overflow_iter = -1;
  double scale_factor = 2.0;
  int64_t scale_window;
  double min_scale;
  int delayed_shift;
  int cur_hysteresis;
  bool consecutive_hysteresis;

  DeepSpeedDynamicLossScaler(double init_scale, int64_t scale_window, double min_scale,
                             int delayed_shift, bool consecutive_hysteresis)
      : cur_scale(init_scale),
        scale_window(scale_window),
        min_scale(min_scale),
        delayed_shift(delayed_shift),
        cur_hysteresis(delayed_shift),
        consecutive_hysteresis(consecutive_hysteresis) {}

  void update_scale(bool overflow) {
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        // (raise_error_at_min_scale is False)
        double next_scale = std::max(cur_scale / scale_factor, min_scale);
        cur_scale = next_scale;
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive_hysteresis) {
        cur_hysteresis = delayed_shift;
      }
      int64_t stable_interval = (cur_iter - last_overflow_iter) - 1;
      if ((stable_interval > 0) && (stable_interval % scale_window == 0)) {
        if (!consecutive_hysteresis) {
          cur_hysteresis = delayed_shift;
        }
        cur_scale *= scale_factor;
      }
    }
    cur_iter += 1;
  }
};

LossScalerOptions Dynamic(int power, int64_t window, int hysteresis, bool consecutive = false,
                          double min_scale = 1) {
  LossScalerOptions o;
  o.initial_scale_power = power;
  o.loss_scale_window = window;
  o.hysteresis = hysteresis;
  o.consecutive_hysteresis = consecutive;
  o.min_loss_scale = min_scale;
  o.max_consecutive_skips = 0;
  return o;
}

// The scale after each Update of `flags` ('O' overflow, '.' clean).
std::vector<double> Scales(LossScaler& scaler, const std::string& flags) {
  std::vector<double> scales;
  for (char f : flags) {
    EXPECT_EQ(scaler.Update(f == 'O'), f == 'O');
    scales.push_back(scaler.scale());
  }
  return scales;
}

// A pattern decides each step's overflow from the step index and the scale it runs at (the
// reference's), so overflows can depend on the scale as they do in training.
using Pattern = std::function<bool(int64_t step, double scale)>;

// Random overflows with probability p, plus every step above 2^24 (a model whose gradients
// overflow fp16 beyond that scale), so the scale stays finite over a long run.
Pattern RandomPattern(double p, unsigned seed) {
  auto rng = std::make_shared<std::mt19937>(seed);
  return [rng, p](int64_t, double scale) {
    const bool spike = std::uniform_real_distribution<double>(0, 1)(*rng) < p;
    return spike || scale > std::ldexp(1.0, 24);
  };
}

// Bursts of 1-5 overflows separated by 0 to 3*window+3 clean steps.
Pattern BurstPattern(int64_t window, unsigned seed) {
  struct State {
    std::mt19937 rng;
    int64_t left = 0;
    bool in_burst = false;
  };
  auto s = std::make_shared<State>(State{std::mt19937(seed)});
  return [s, window](int64_t, double) {
    while (s->left == 0) {
      s->in_burst = !s->in_burst;
      s->left = s->in_burst ? std::uniform_int_distribution<int64_t>(1, 5)(s->rng)
                            : std::uniform_int_distribution<int64_t>(0, 3 * window + 3)(s->rng);
    }
    --s->left;
    return s->in_burst;
  };
}

// Overflow at every step until the minimum scale, 5 more there, then clean for 2 windows + 3
// steps, and again.
Pattern DownToMinimumPattern(double min_scale, int64_t window) {
  auto clean_left = std::make_shared<int64_t>(0);
  auto at_min = std::make_shared<int64_t>(0);
  return [=](int64_t, double scale) {
    if (*clean_left > 0) {
      --*clean_left;
      return false;
    }
    if (scale == min_scale && ++*at_min > 5) {
      *at_min = 0;
      *clean_left = 2 * std::min<int64_t>(window, 100) + 3;
      return false;
    }
    return true;
  };
}

// Runs the scaler and DeepSpeed's reference side by side for `steps` steps of `pattern` and
// compares the whole state after every step; stops at the first difference.
void ExpectSameAsDeepSpeed(const LossScalerOptions& o, const Pattern& pattern, int64_t steps,
                           const std::string& what) {
  LossScaler scaler(o);
  DeepSpeedDynamicLossScaler ref(std::ldexp(1.0, o.initial_scale_power), o.loss_scale_window,
                                 o.min_loss_scale, o.hysteresis, o.consecutive_hysteresis);
  int64_t skipped = 0;
  for (int64_t step = 0; step < steps; ++step) {
    ASSERT_EQ(scaler.scale(), ref.cur_scale) << what << " before step " << step;
    const bool overflow = pattern(step, ref.cur_scale);
    skipped += overflow;
    ASSERT_EQ(scaler.Update(overflow), overflow);
    ref.update_scale(overflow);
    const nlohmann::json s = scaler.State();
    ASSERT_TRUE(s["cur_scale"].get<double>() == ref.cur_scale &&
                s["cur_iter"].get<int64_t>() == ref.cur_iter &&
                s["last_overflow_iter"].get<int64_t>() == ref.last_overflow_iter &&
                s["cur_hysteresis"].get<int>() == ref.cur_hysteresis)
        << what << " after step " << step << ": " << s.dump() << " vs DeepSpeed scale "
        << ref.cur_scale << " iter " << ref.cur_iter << " last_overflow " << ref.last_overflow_iter
        << " hysteresis " << ref.cur_hysteresis;
  }
  EXPECT_EQ(scaler.skipped_steps(), skipped) << what;
}

TEST(LossScalerTest, MatchesDeepSpeedOnInjectedOverflows) {
  int64_t configs = 0;
  for (int hysteresis : {1, 2, 3}) {
    for (bool consecutive : {false, true}) {
      for (int64_t window : {1, 2, 5, 1000}) {
        for (double min_scale : {1.0, 0.25}) {
          const LossScalerOptions o = Dynamic(16, window, hysteresis, consecutive, min_scale);
          const std::string what = "hysteresis " + std::to_string(hysteresis) + " consecutive " +
                                   std::to_string(consecutive) + " window " +
                                   std::to_string(window) + " min " + std::to_string(min_scale);
          unsigned seed = 1;
          for (double p : {0.3, 0.05, 0.005}) {
            ExpectSameAsDeepSpeed(o, RandomPattern(p, seed++), 3000,
                                  what + " random p " + std::to_string(p));
          }
          ExpectSameAsDeepSpeed(o, BurstPattern(window, seed++), 3000, what + " bursts");
          ExpectSameAsDeepSpeed(o, DownToMinimumPattern(min_scale, window), 3000,
                                what + " down to minimum");
          ++configs;
        }
      }
    }
  }
  EXPECT_EQ(configs, 48);
}

// The patterns above do reach the states they are meant to test.
TEST(LossScalerTest, PatternsReachMinimumAndGrowth) {
  DeepSpeedDynamicLossScaler ref(65536, 5, 0.25, 2, false);
  Pattern down = DownToMinimumPattern(0.25, 5);
  double lowest = ref.cur_scale, highest = 0;
  for (int64_t step = 0; step < 200; ++step) {
    ref.update_scale(down(step, ref.cur_scale));
    lowest = std::min(lowest, ref.cur_scale);
    highest = std::max(highest, step > 50 ? ref.cur_scale : 0.0);
  }
  EXPECT_EQ(lowest, 0.25);
  EXPECT_GT(highest, 0.25);  // grows again in the clean stretches
}

// Initial 2^16, window 2, hysteresis 2, by hand from Note [DeepSpeed dynamic loss scale]:
// steps 0-3 clean: the third clean step (stable = 2) doubles; 4: hysteresis 2 -> 1;
// 5, 6: halve; 7-11 clean: doubles at 9 (refilling hysteresis) and 11; 12: hysteresis 2 -> 1;
// 13, 14 clean (stable 0, 1): no growth, no refill; 15: halves.
TEST(LossScalerTest, HandComputedWindow2Hysteresis2) {
  const double k = 65536;
  LossScaler scaler(Dynamic(16, 2, 2));
  EXPECT_EQ(scaler.scale(), k);
  EXPECT_EQ(Scales(scaler, "....OOO.....O..O"),
            (std::vector<double>{k, k, 2 * k, 2 * k, 2 * k, k, k / 2, k / 2, k / 2, k, k, 2 * k,
                                 2 * k, 2 * k, 2 * k, k}));
  EXPECT_EQ(scaler.skipped_steps(), 5);
  EXPECT_EQ(scaler.consecutive_skips(), 1);
}

// The same flags with consecutive_hysteresis: every clean step refills the hysteresis, so the
// overflow at step 15 is absorbed.
TEST(LossScalerTest, HandComputedConsecutiveHysteresis) {
  const double k = 65536;
  LossScaler scaler(Dynamic(16, 2, 2, true));
  EXPECT_EQ(Scales(scaler, "....OOO.....O..O"),
            (std::vector<double>{k, k, 2 * k, 2 * k, 2 * k, k, k / 2, k / 2, k / 2, k, k, 2 * k,
                                 2 * k, 2 * k, 2 * k, 2 * k}));
}

// Window 1, hysteresis 1, from 2^4 to the minimum 1 and below it (no exception, unlike
// DeepSpeed), then growth from the second clean step on.
TEST(LossScalerTest, HandComputedWindow1DownToMinimum) {
  LossScaler scaler(Dynamic(4, 1, 1));
  EXPECT_EQ(Scales(scaler, "OOOOOO...O.."),
            (std::vector<double>{8, 4, 2, 1, 1, 1, 1, 2, 4, 2, 2, 4}));
  EXPECT_EQ(scaler.skipped_steps(), 7);

  LossScaler quarter(Dynamic(0, 1, 1, false, 0.25));
  EXPECT_EQ(Scales(quarter, "OOOO"), (std::vector<double>{0.5, 0.25, 0.25, 0.25}));
}

// The expectations of DeepSpeed's own unit tests (tests/unit/runtime/half_precision:
// test_dynamic_loss_scale.py and test_zero_optim_overflow.py), which pin the window's
// off-by-one: with window 2 the scale after k clean steps from the start is 2^(8+(k-1)/2).
TEST(LossScalerTest, AgreesWithDeepSpeedUnitTests) {
  LossScaler no_overflow(Dynamic(8, 2, 2));
  for (int k = 1; k <= 10; ++k) {
    no_overflow.Update(false);
    EXPECT_EQ(no_overflow.scale(), std::ldexp(1.0, 8 + (k - 1) / 2)) << k;
  }
  LossScaler all_overflow(Dynamic(4, 2, 1));
  EXPECT_EQ(Scales(all_overflow, "OOOOOOOO"), (std::vector<double>{8, 4, 2, 1, 1, 1, 1, 1}));

  LossScaler some_overflow(Dynamic(8, 2, 1));
  EXPECT_EQ(Scales(some_overflow, "OO...O"), (std::vector<double>{128, 64, 64, 64, 128, 64}));

  LossScaler hysteresis3(Dynamic(8, 1000, 3));
  EXPECT_EQ(Scales(hysteresis3, "OOOO"), (std::vector<double>{256, 256, 128, 64}));

  LossScaler refilled(Dynamic(8, 1000, 2, true));
  Scales(refilled, "O.O.O.O.");
  EXPECT_EQ(refilled.scale(), 256);
}

TEST(LossScalerTest, StaticScaleNeverChangesButSkips) {
  LossScalerOptions o;
  o.loss_scale = 128;
  LossScaler scaler(o);
  EXPECT_FALSE(scaler.dynamic());
  EXPECT_TRUE(LossScaler(LossScalerOptions{}).dynamic());
  EXPECT_EQ(Scales(scaler, "O.OO...."), std::vector<double>(8, 128));
  EXPECT_EQ(scaler.skipped_steps(), 3);
  EXPECT_EQ(scaler.consecutive_skips(), 0);
  EXPECT_EQ(scaler.State()["cur_iter"], 8);
}

TEST(LossScalerTest, DefaultsAreDeepSpeeds) {
  const LossScalerOptions o;
  EXPECT_EQ(o.loss_scale, 0);
  EXPECT_EQ(o.initial_scale_power, 16);
  EXPECT_EQ(o.loss_scale_window, 1000);
  EXPECT_EQ(o.hysteresis, 2);
  EXPECT_FALSE(o.consecutive_hysteresis);
  EXPECT_EQ(o.min_loss_scale, 1);
  EXPECT_EQ(o.max_consecutive_skips, 50);
  // 50 leaves room for the start-up descent from 2^32 to 1 with hysteresis 2 (33 overflows).
  LossScalerOptions big = o;
  big.initial_scale_power = 32;
  LossScaler scaler(big);
  for (int i = 0; i < 33; ++i) scaler.Update(true);
  EXPECT_EQ(scaler.scale(), 1);
}

TEST(LossScalerTest, ConsecutiveSkipLimitThrows) {
  LossScalerOptions o = Dynamic(4, 2, 1);
  o.max_consecutive_skips = 5;
  LossScaler scaler(o);
  Scales(scaler, "OOOO");
  EXPECT_EQ(scaler.consecutive_skips(), 4);
  ExpectErrorWith<Error>(
      [&] { scaler.Update(true); },
      {"5 optimizer steps in a row were skipped", "inf or NaN", "dynamic fp16 loss scale now 1",
       "fp16.min_loss_scale = 1", "max_consecutive_skips = 5", "lower the learning rate", "bf16",
       "check the data"});
  EXPECT_EQ(scaler.consecutive_skips(), 5);
  EXPECT_EQ(scaler.skipped_steps(), 5);
  EXPECT_EQ(scaler.scale(), 1);

  // A clean step in between resets the count in a row, not the total.
  LossScaler resets(o);
  Scales(resets, "OOOO.OOOO.OOOO");
  EXPECT_EQ(resets.skipped_steps(), 12);
  EXPECT_EQ(resets.consecutive_skips(), 4);

  // 0: no limit.
  LossScaler unlimited(Dynamic(4, 2, 1));
  for (int i = 0; i < 1000; ++i) unlimited.Update(true);
  EXPECT_EQ(unlimited.consecutive_skips(), 1000);
  EXPECT_EQ(unlimited.scale(), 1);

  LossScalerOptions s;
  s.loss_scale = 128;
  s.max_consecutive_skips = 3;
  LossScaler fixed(s);
  Scales(fixed, "OO");
  ExpectErrorWith<Error>([&] { fixed.Update(true); },
                         {"3 optimizer steps", "static fp16 loss scale 128"});
}

TEST(LossScalerTest, StateRoundTripContinuesTheSameSequence) {
  for (bool consecutive : {false, true}) {
    const LossScalerOptions o = Dynamic(16, 5, 3, consecutive, 0.25);
    LossScaler uninterrupted(o), first(o);
    Pattern pa = RandomPattern(0.1, 7), pb = RandomPattern(0.1, 7);
    for (int64_t step = 0; step < 1234; ++step) {
      const bool overflow = pa(step, uninterrupted.scale());
      ASSERT_EQ(overflow, pb(step, first.scale()));
      uninterrupted.Update(overflow);
      first.Update(overflow);
    }
    // Through text, as a checkpoint stores it.
    const std::string saved = first.State().dump();
    LossScaler resumed(o);
    resumed.Restore(nlohmann::json::parse(saved));
    EXPECT_EQ(resumed.State(), uninterrupted.State());
    EXPECT_GT(resumed.skipped_steps(), 0);
    for (int64_t step = 1234; step < 3000; ++step) {
      const bool overflow = pa(step, uninterrupted.scale());
      uninterrupted.Update(overflow);
      resumed.Update(overflow);
      ASSERT_EQ(resumed.scale(), uninterrupted.scale()) << step;
    }
    EXPECT_EQ(resumed.State(), uninterrupted.State());
  }
}

// A hysteresis spent before the checkpoint stays spent (DeepSpeed's
// test_hysteresis_survives_a_checkpoint), and a larger one is capped at the configured value.
TEST(LossScalerTest, RestoreKeepsSpentHysteresis) {
  LossScaler before(Dynamic(8, 100, 3));
  before.Update(true);
  LossScaler after(Dynamic(8, 100, 3));
  after.Restore(before.State());
  EXPECT_EQ(Scales(after, "OO"), (std::vector<double>{256, 128}));

  nlohmann::json state = LossScaler(Dynamic(8, 100, 3)).State();
  LossScaler smaller(Dynamic(8, 100, 2));
  smaller.Restore(state);
  EXPECT_EQ(smaller.State()["cur_hysteresis"], 2);
}

TEST(LossScalerTest, StaticRestoreKeepsConfiguredScale) {
  LossScalerOptions o;
  o.loss_scale = 64;
  LossScaler a(o);
  Scales(a, "O.O");
  o.loss_scale = 32;
  LossScaler b(o);
  b.Restore(a.State());
  EXPECT_EQ(b.scale(), 32);
  EXPECT_EQ(b.skipped_steps(), 2);
  EXPECT_EQ(b.State()["cur_iter"], 3);
}

TEST(LossScalerTest, RestoreRejectsBadState) {
  LossScaler scaler(Dynamic(16, 10, 2));
  const nlohmann::json good = scaler.State();
  nlohmann::json missing = good;
  missing.erase("cur_hysteresis");
  ExpectErrorWith<Error>([&] { scaler.Restore(missing); }, {"missing \"cur_hysteresis\""});
  nlohmann::json wrong_type = good;
  wrong_type["cur_iter"] = "7";
  ExpectErrorWith<Error>([&] { scaler.Restore(wrong_type); }, {"\"cur_iter\" must be an integer"});
  nlohmann::json bad_scale = good;
  bad_scale["cur_scale"] = -1.0;
  ExpectErrorWith<Error>([&] { scaler.Restore(bad_scale); }, {"inconsistent scale"});
  nlohmann::json bad_hysteresis = good;
  bad_hysteresis["cur_hysteresis"] = 0;
  ExpectErrorWith<Error>([&] { scaler.Restore(bad_hysteresis); }, {"inconsistent hysteresis"});
  ExpectErrorWith<Error>([&] { scaler.Restore(nlohmann::json::array()); }, {"\"dynamic\""});

  LossScalerOptions s;
  s.loss_scale = 8;
  ExpectErrorWith<Error>([&] { LossScaler(s).Restore(good); },
                         {"checkpoint's loss scale is dynamic", "fp16.loss_scale = 8"});
  // The failed restores left the state alone.
  EXPECT_EQ(scaler.State(), good);
}

TEST(LossScalerTest, RejectsInvalidOptions) {
  auto expect_config_error = [](LossScalerOptions o, const std::string& key) {
    ExpectErrorWith<ConfigError>([&] { LossScaler scaler(o); }, {key});
  };
  LossScalerOptions o;
  o.loss_scale = -1;
  expect_config_error(o, "fp16.loss_scale");
  o.loss_scale = std::nan("");
  expect_config_error(o, "fp16.loss_scale");
  o = {};
  o.loss_scale_window = 0;
  expect_config_error(o, "fp16.loss_scale_window");
  o = {};
  o.hysteresis = 0;
  expect_config_error(o, "fp16.hysteresis");
  o = {};
  o.min_loss_scale = 0;
  expect_config_error(o, "fp16.min_loss_scale");
  o = {};
  o.initial_scale_power = 2000;
  expect_config_error(o, "fp16.initial_scale_power");
  o = {};
  o.max_consecutive_skips = -1;
  expect_config_error(o, "max_consecutive_skips");
  // A static scale ignores the dynamic keys, as DeepSpeed does.
  o = {};
  o.loss_scale = 4;
  o.hysteresis = 0;
  EXPECT_EQ(LossScaler(o).scale(), 4);
}

// --- HasInfOrNan ---

struct Specials {
  DType dtype;
  std::vector<uint32_t> bad;     // +inf, -inf, quiet NaN, signalling NaN, negative NaN
  std::vector<uint32_t> finite;  // largest, most negative, smallest subnormal, -0
};

std::vector<Specials> AllSpecials() {
  return {
      {DType::kF32,
       {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffc00000u},
       {0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000000u}},
      {DType::kBF16, {0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffc0}, {0x7f7f, 0xff7f, 0x0001, 0x8000}},
      {DType::kF16, {0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe00}, {0x7bff, 0xfbff, 0x0001, 0x8000}},
  };
}

// Host storage for one tensor of any of the three types, written by bit pattern.
struct Storage {
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> u16;

  Storage(DType d, int64_t n, unsigned seed) : dtype(d) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 100.0f);
    if (d == DType::kF32) {
      f32.resize(n);
      for (float& x : f32) x = normal(rng);
    } else {
      u16.resize(n);
      for (uint16_t& x : u16)
        x = d == DType::kBF16 ? FloatToBf16(normal(rng)) : FloatToHalf(normal(rng));
    }
  }
  void Set(int64_t i, uint32_t bits) {
    if (dtype == DType::kF32) {
      std::memcpy(&f32[i], &bits, 4);
    } else {
      u16[i] = static_cast<uint16_t>(bits);
    }
  }
  uint32_t Get(int64_t i) const {
    uint32_t bits = 0;
    if (dtype == DType::kF32) {
      std::memcpy(&bits, &f32[i], 4);
    } else {
      bits = u16[i];
    }
    return bits;
  }
  Tensor tensor() {
    const int64_t n =
        dtype == DType::kF32 ? static_cast<int64_t>(f32.size()) : static_cast<int64_t>(u16.size());
    void* data = dtype == DType::kF32 ? static_cast<void*>(f32.data()) : u16.data();
    return Tensor(data, dtype, Shape{n});
  }
};

TEST(HasInfOrNanTest, FindsEverySpecialAtAnyPosition) {
  for (const Specials& sp : AllSpecials()) {
    for (int64_t n : {1, 15, 17, 65536, 65537, 3 * 65536 + 5}) {
      Storage s(sp.dtype, n, static_cast<unsigned>(n));
      for (size_t k = 0; k < sp.finite.size(); ++k) s.Set((k * 7) % n, sp.finite[k]);
      ASSERT_FALSE(HasInfOrNan(s.tensor())) << DTypeName(sp.dtype) << " n " << n;
      for (int64_t pos : {int64_t{0}, int64_t{1}, n / 2, int64_t{65535}, int64_t{65536}, n - 1}) {
        if (pos >= n) continue;
        const uint32_t saved = s.Get(pos);
        for (uint32_t bad : sp.bad) {
          s.Set(pos, bad);
          EXPECT_TRUE(HasInfOrNan(s.tensor()))
              << DTypeName(sp.dtype) << " n " << n << " pos " << pos << " bits " << bad;
        }
        s.Set(pos, saved);
      }
      EXPECT_FALSE(HasInfOrNan(s.tensor()));
    }
  }
}

TEST(HasInfOrNanTest, FiniteDataWithLargeSumIsNotOverflow) {
  std::vector<float> big(1000, 3e38f);  // the fp32 sum overflows; no element does
  EXPECT_FALSE(HasInfOrNan(Tensor(big.data(), DType::kF32, Shape{10, 100})));
}

TEST(HasInfOrNanTest, LooksAtEveryTensor) {
  Storage a(DType::kF32, 100000, 1), b(DType::kBF16, 3, 2), c(DType::kF16, 70000, 3);
  Storage empty(DType::kF16, 0, 4);
  std::vector<Tensor> tensors = {a.tensor(), empty.tensor(), b.tensor(), c.tensor()};
  EXPECT_FALSE(HasInfOrNan(tensors));
  c.Set(69999, 0x7c00);
  EXPECT_TRUE(HasInfOrNan(tensors));
  c.Set(69999, 0);
  b.Set(1, 0x7fc0);
  EXPECT_TRUE(HasInfOrNan(tensors));
  EXPECT_FALSE(HasInfOrNan(std::span<const Tensor>()));
}

TEST(HasInfOrNanTest, RejectsOtherTypesAndDevices) {
  std::vector<int32_t> ints(4, 0);
  std::vector<float> floats(4, 0.0f);
  std::vector<Tensor> tensors = {Tensor(floats.data(), DType::kF32, Shape{4}),
                                 Tensor(ints.data(), DType::kI32, Shape{4})};
  ExpectErrorWith<Error>([&] { HasInfOrNan(tensors); },
                         {"tensor 1", "int32", "fp32, bf16 or fp16"});
  Tensor on_gpu(floats.data(), DType::kF32, Shape{4}, Device::Cuda(0));
  ExpectErrorWith<Error>([&] { HasInfOrNan(on_gpu); }, {"tensor 0", "cuda:0", "on cpu"});
}

TEST(LossScalerTest, OptionsComeFromEveryKeyOfTheFp16Section) {
  PrecisionConfig p;
  p.loss_scale = 128;
  p.initial_scale_power = 9;
  p.loss_scale_window = 7;
  p.hysteresis = 3;
  p.consecutive_hysteresis = true;
  p.min_loss_scale = 0.5;
  p.max_consecutive_skips = 11;
  const LossScalerOptions o = LossScalerOptionsFrom(p);
  EXPECT_EQ(o.loss_scale, 128);
  EXPECT_EQ(o.initial_scale_power, 9);
  EXPECT_EQ(o.loss_scale_window, 7);
  EXPECT_EQ(o.hysteresis, 3);
  EXPECT_TRUE(o.consecutive_hysteresis);
  EXPECT_EQ(o.min_loss_scale, 0.5);
  EXPECT_EQ(o.max_consecutive_skips, 11);
}

}  // namespace
}  // namespace ztrain::optim
