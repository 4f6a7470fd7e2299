#include "optim/adam.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"

namespace ztrain::optim {
namespace {

constexpr int kSteps = 4;

std::vector<AdamImpl> AvailableImpls() {
  std::vector<AdamImpl> impls;
  for (AdamImpl impl : {AdamImpl::kScalar, AdamImpl::kAvx2, AdamImpl::kAvx512}) {
    if (AdamImplAvailable(impl)) impls.push_back(impl);
  }
  return impls;
}

// Gradients of magnitude [0.5, 1.5] and random sign: with |weight_decay * p| <= 0.1 the
// (L2-decayed) gradient stays away from 0, so float and double agree to a relative error of
// a few ulps everywhere (near 0, sign(g) would be ill-conditioned on the first step).
struct State {
  std::vector<float> p, m, v;
  std::vector<std::vector<float>> grads;  // one per step

  State(int64_t n, uint32_t seed) : p(n), m(n, 0.0f), v(n, 0.0f), grads(kSteps) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f), mag(0.5f, 1.5f);
    for (float& x : p) x = unit(rng);
    for (auto& g : grads) {
      g.resize(n);
      for (float& x : g) x = (rng() & 1 ? 1.0f : -1.0f) * mag(rng);
    }
  }
};

// Note [DeepSpeed Adam formula], in double, written independently of optim/.
struct Reference {
  std::vector<double> p, m, v;
  explicit Reference(const State& s)
      : p(s.p.begin(), s.p.end()), m(s.p.size(), 0.0), v(s.p.size(), 0.0) {}

  void Step(const AdamStepArgs& a, const std::vector<float>& grad) {
    const double b1 = a.beta1, b2 = a.beta2, wd = a.weight_decay, lr = a.lr;
    const double bc1 = a.bias_correction ? 1.0 - std::pow(b1, a.step) : 1.0;
    const double bc2 = a.bias_correction ? 1.0 - std::pow(b2, a.step) : 1.0;
    for (size_t i = 0; i < p.size(); ++i) {
      double g = static_cast<double>(grad[i]) * a.grad_scale;
      if (!a.adam_w_mode) g += wd * p[i];
      m[i] = b1 * m[i] + (1.0 - b1) * g;
      v[i] = b2 * v[i] + (1.0 - b2) * g * g;
      double update = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + a.eps);
      if (a.adam_w_mode) update += wd * p[i];
      p[i] -= lr * update;
    }
  }
};

struct Variant {
  const char* name;
  AdamStepArgs args;
};

std::vector<Variant> Variants() {
  AdamStepArgs adamw;
  adamw.lr = 1e-2f;
  adamw.weight_decay = 0.1f;
  AdamStepArgs l2 = adamw;
  l2.adam_w_mode = false;
  AdamStepArgs no_bias = adamw;
  no_bias.bias_correction = false;
  AdamStepArgs scaled = adamw;
  scaled.grad_scale = 0.37f;
  AdamStepArgs big_eps = l2;  // eps comparable to sqrt(v): catches eps in the wrong place
  big_eps.eps = 0.05f;
  big_eps.beta1 = 0.8f;
  big_eps.beta2 = 0.95f;
  return {{"adamw", adamw},
          {"l2", l2},
          {"no_bias_correction", no_bias},
          {"grad_scale", scaled},
          {"big_eps", big_eps}};
}

void RunSteps(AdamStepArgs args, State& s, AdamImpl impl) {
  for (int k = 0; k < kSteps; ++k) {
    args.step = k + 1;
    AdamStep(args, s.p.data(), s.grads[k].data(), s.m.data(), s.v.data(),
             static_cast<int64_t>(s.p.size()), impl);
  }
}

TEST(AdamTest, EveryImplMatchesDoubleFormula) {
  for (AdamImpl impl : AvailableImpls()) {
    for (const Variant& variant : Variants()) {
      for (int64_t n : {0, 1, 15, 17, 1000003}) {
        SCOPED_TRACE(std::string(AdamImplName(impl)) + " " + variant.name +
                     " n=" + std::to_string(n));
        State s(n, 42);
        Reference ref(s);
        RunSteps(variant.args, s, impl);
        AdamStepArgs args = variant.args;
        for (int k = 0; k < kSteps; ++k) {
          args.step = k + 1;
          ref.Step(args, s.grads[k]);
        }
        // m, v: a few float roundings per step. p: its own rounding plus lr * (update error).
        int bad = 0;
        for (int64_t i = 0; i < n && bad < 5; ++i) {
          const bool ok = std::abs(s.m[i] - ref.m[i]) <= 1e-6 * (std::abs(ref.m[i]) + 0.2) &&
                          std::abs(s.v[i] - ref.v[i]) <= 2e-6 * ref.v[i] &&
                          std::abs(s.p[i] - ref.p[i]) <= 5e-7 * std::abs(ref.p[i]) + 2e-7 * kSteps;
          if (!ok) {
            ADD_FAILURE() << "i=" << i << " p " << s.p[i] << " vs " << ref.p[i] << ", m " << s.m[i]
                          << " vs " << ref.m[i] << ", v " << s.v[i] << " vs " << ref.v[i];
            ++bad;
          }
        }
      }
    }
  }
}

TEST(AdamTest, SimdImplsMatchScalarReference) {
  for (AdamImpl impl : AvailableImpls()) {
    if (impl == AdamImpl::kScalar) continue;
    for (const Variant& variant : Variants()) {
      SCOPED_TRACE(std::string(AdamImplName(impl)) + " " + variant.name);
      State simd(1000003, 7), scalar(1000003, 7);
      RunSteps(variant.args, simd, impl);
      RunSteps(variant.args, scalar, AdamImpl::kScalar);
      double max_p = 0, max_m = 0, max_v = 0;  // relative differences
      for (size_t i = 0; i < simd.p.size(); ++i) {
        const double p = scalar.p[i], m = scalar.m[i], v = scalar.v[i];
        max_p = std::max(max_p, std::abs(simd.p[i] - p) / (std::abs(p) + 0.1));
        max_m = std::max(max_m, std::abs(simd.m[i] - m) / (std::abs(m) + 0.2));
        max_v = std::max(max_v, std::abs(simd.v[i] - v) / v);
      }
      // Only fused multiply-adds differ: a few ulps (float ulp = 1.2e-7).
      EXPECT_LT(max_p, 1e-6);
      EXPECT_LT(max_m, 1e-6);
      EXPECT_LT(max_v, 1e-6);
    }
  }
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Both vector kernels are optim/adam_simd.h's one loop: the same fused operations in the same
// order give the same bits, on whole vectors and on every length of masked tail.
TEST(AdamTest, Avx2AndAvx512GiveTheSameBits) {
  if (!AdamImplAvailable(AdamImpl::kAvx2) || !AdamImplAvailable(AdamImpl::kAvx512)) {
    GTEST_SKIP() << "needs AVX2 and AVX-512";
  }
  for (const Variant& variant : Variants()) {
    for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 33, 1000003}) {
      SCOPED_TRACE(std::string(variant.name) + " n=" + std::to_string(n));
      State avx2(n, 11), avx512(n, 11);
      RunSteps(variant.args, avx2, AdamImpl::kAvx2);
      RunSteps(variant.args, avx512, AdamImpl::kAvx512);
      EXPECT_TRUE(SameBits(avx2.p, avx512.p));
      EXPECT_TRUE(SameBits(avx2.m, avx512.m));
      EXPECT_TRUE(SameBits(avx2.v, avx512.v));
    }
  }
}

TEST(AdamTest, ResultDoesNotDependOnThreadsOrSplit) {
  const AdamStepArgs args = Variants()[1].args;
  for (AdamImpl impl : AvailableImpls()) {
    SCOPED_TRACE(AdamImplName(impl));
    const int64_t n = 1000003;
    State one(n, 3), many(n, 3), split(n, 3);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    RunSteps(args, one, impl);
    omp_set_num_threads(std::max(2, threads));
    RunSteps(args, many, impl);
    omp_set_num_threads(threads);
    // Two calls split at a multiple of 16, as a ZeRO shard boundary would.
    const int64_t cut = 16 * 20011;
    AdamStepArgs a = args;
    for (int k = 0; k < kSteps; ++k) {
      a.step = k + 1;
      AdamStep(a, split.p.data(), split.grads[k].data(), split.m.data(), split.v.data(), cut, impl);
      AdamStep(a, split.p.data() + cut, split.grads[k].data() + cut, split.m.data() + cut,
               split.v.data() + cut, n - cut, impl);
    }
    EXPECT_TRUE(SameBits(one.p, many.p) && SameBits(one.m, many.m) && SameBits(one.v, many.v));
    EXPECT_TRUE(SameBits(one.p, split.p) && SameBits(one.m, split.m) && SameBits(one.v, split.v));
  }
}

TEST(AdamTest, GradScaleEqualsPrescaledGradient) {
  AdamStepArgs scaled = Variants()[0].args;
  scaled.grad_scale = 0.25f;  // a power of two: pre-scaling is exact, so results are equal
  for (AdamImpl impl : AvailableImpls()) {
    State a(4099, 9), b(4099, 9);
    for (auto& g : b.grads) {
      for (float& x : g) x *= 0.25f;
    }
    RunSteps(scaled, a, impl);
    RunSteps(Variants()[0].args, b, impl);
    EXPECT_TRUE(SameBits(a.p, b.p) && SameBits(a.m, b.m)) << AdamImplName(impl);
  }
}

TEST(AdamTest, FirstStepMovesEachWeightByLrTimesSign) {
  // Bias-corrected step 1 without decay: update = g / (|g| + eps) = sign(g) (to 1e-8).
  AdamStepArgs args;
  args.lr = 0.5f;
  for (AdamImpl impl : AvailableImpls()) {
    std::vector<float> p = {1.0f, 1.0f, 1.0f}, g = {3.0f, -0.75f, 0.5f}, m(3), v(3);
    AdamStep(args, p.data(), g.data(), m.data(), v.data(), 3, impl);
    EXPECT_FLOAT_EQ(p[0], 0.5f) << AdamImplName(impl);
    EXPECT_FLOAT_EQ(p[1], 1.5f);
    EXPECT_FLOAT_EQ(p[2], 0.5f);
    EXPECT_NEAR(m[1], -0.075f, 1e-7);  // (1 - beta1) is 0.1 only to float precision
    EXPECT_NEAR(v[0], 0.009f, 2e-7);
  }
}

TEST(AdamTest, DispatchAndErrors) {
  const AdamImpl best = BestAdamImpl();
  EXPECT_NE(best, AdamImpl::kAuto);
  EXPECT_TRUE(AdamImplAvailable(best));
  EXPECT_TRUE(AdamImplAvailable(AdamImpl::kScalar));
  if (__builtin_cpu_supports("avx512f")) {
    EXPECT_EQ(best, AdamImpl::kAvx512);
  }
  EXPECT_STREQ(AdamImplName(AdamImpl::kAvx2), "avx2");
  float x = 0.0f;
  AdamStepArgs args;
  args.step = 0;
  EXPECT_THROW(AdamStep(args, &x, &x, &x, &x, 1), Error);
  args.step = 1;
  EXPECT_THROW(AdamStep(args, &x, &x, &x, &x, -1), Error);
  for (AdamImpl impl : {AdamImpl::kAvx2, AdamImpl::kAvx512}) {
    if (!AdamImplAvailable(impl)) {
      EXPECT_THROW(AdamStep(args, &x, &x, &x, &x, 1, impl), Error);
    }
  }
}

TEST(AdamTest, ArgsForConfig) {
  OptimizerConfig c;
  c.lr = 1e-3;
  c.beta1 = 0.85;
  c.beta2 = 0.95;
  c.eps = 1e-6;
  c.weight_decay = 0.1;
  c.adam_w_mode = false;
  c.bias_correction = false;
  const ParamGroups groups(c);  // default, no_decay (1-dimensional), frozen
  const AdamStepArgs a = AdamArgsFor(c, groups[0], 2.5e-4, 7, 0.5f);
  EXPECT_FLOAT_EQ(a.lr, 2.5e-4f);  // the schedule's lr, not config.lr
  EXPECT_FLOAT_EQ(a.beta1, 0.85f);
  EXPECT_FLOAT_EQ(a.beta2, 0.95f);
  EXPECT_FLOAT_EQ(a.eps, 1e-6f);
  EXPECT_FLOAT_EQ(a.weight_decay, 0.1f);
  EXPECT_FALSE(a.adam_w_mode);
  EXPECT_FALSE(a.bias_correction);
  EXPECT_EQ(a.step, 7);
  EXPECT_FLOAT_EQ(a.grad_scale, 0.5f);
  EXPECT_EQ(AdamArgsFor(c, groups[1], 2.5e-4, 7, 0.5f).weight_decay, 0.0f);
  ParamGroupRule slow;
  slow.name = "slow";
  slow.params = {"wte.*"};
  slow.weight_decay = 0.25;
  slow.lr_scale = 0.5;
  c.param_groups = {slow};
  const ParamGroups scaled(c);
  const AdamStepArgs s = AdamArgsFor(c, scaled[1], 2.5e-4, 7, 0.5f);
  EXPECT_EQ(s.lr, static_cast<float>(1.25e-4));
  EXPECT_EQ(s.weight_decay, 0.25f);
}

}  // namespace
}  // namespace ztrain::optim
