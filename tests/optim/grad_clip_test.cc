#include "optim/grad_clip.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../expect_error.h"
#include "core/error.h"
#include "kernels/ops.h"

namespace ztrain::optim {
namespace {

std::vector<AdamImpl> AvailableImpls() {
  std::vector<AdamImpl> impls;
  for (AdamImpl impl : {AdamImpl::kScalar, AdamImpl::kAvx2, AdamImpl::kAvx512}) {
    if (AdamImplAvailable(impl)) impls.push_back(impl);
  }
  return impls;
}

// Gradients of awkward sizes (empty, shorter than a vector, across block boundaries).
struct Grads {
  std::vector<std::vector<float>> data;
  std::vector<Tensor> tensors;

  explicit Grads(std::vector<int64_t> sizes) {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t n : sizes) {
      data.emplace_back(n);
      for (float& x : data.back()) x = normal(rng) * 1e-2f;
    }
    for (auto& d : data) {
      tensors.emplace_back(d.data(), DType::kF32, Shape{static_cast<int64_t>(d.size())});
    }
  }
  // A long double sum in index order: a reference independent of the lane order.
  double ReferenceNorm() const {
    long double sum = 0;
    for (const auto& d : data) {
      for (float x : d) sum += static_cast<long double>(x) * x;
    }
    return std::sqrt(static_cast<double>(sum));
  }
};

TEST(GradClipTest, GlobalNormMatchesDoubleReference) {
  Grads g({0, 1, 15, 17, 65536, 65537, 1000003, 768});
  const double ref = g.ReferenceNorm();
  for (AdamImpl impl : AvailableImpls()) {
    EXPECT_NEAR(GlobalNorm(g.tensors, impl), ref, 1e-13 * ref) << AdamImplName(impl);
  }
  EXPECT_EQ(GlobalNorm({}), 0.0);
}

TEST(GradClipTest, NormIsBitwiseIdenticalAcrossImplsAndThreads) {
  Grads g({17, 1000003, 333});
  omp_set_num_threads(1);
  const double one_thread = GradSquaredSum(g.tensors, AdamImpl::kScalar);
  omp_set_num_threads(2);
  for (AdamImpl impl : AvailableImpls()) {
    const double sum = GradSquaredSum(g.tensors, impl);
    EXPECT_EQ(std::memcmp(&sum, &one_thread, sizeof(double)), 0) << AdamImplName(impl);
  }
}

TEST(GradClipTest, NonFiniteGradientGivesNonFiniteNorm) {
  for (AdamImpl impl : AvailableImpls()) {
    Grads g({100, 1000});
    g.data[1][999] = std::numeric_limits<float>::infinity();  // in a masked tail
    EXPECT_TRUE(std::isinf(GlobalNorm(g.tensors, impl)));
    g.data[0][3] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(GlobalNorm(g.tensors, impl)));
    EXPECT_EQ(ClipCoefficient(GlobalNorm(g.tensors, impl), 1.0), 1.0f);
  }
}

TEST(GradClipTest, RejectsNonFp32Gradients) {
  uint16_t h[4] = {};
  Tensor bf16(h, DType::kBF16, {4});
  EXPECT_THROW(GlobalNorm(std::span<const Tensor>(&bf16, 1)), Error);
}

TEST(GradClipTest, OpsOverloadOnHostIsTheHostSumBitwise) {
  Grads g({17, 1000003, 333});
  const auto ops = kernels::MakeCpuOps();
  const double host = GradSquaredSum(g.tensors);
  const double via_ops = GradSquaredSum(*ops, g.tensors);
  EXPECT_EQ(std::memcmp(&host, &via_ops, sizeof(double)), 0) << host << " vs " << via_ops;
  EXPECT_EQ(GradSquaredSum(*ops, {}), 0.0);
}

TEST(GradClipTest, OpsOverloadRejectsGradientsOffTheOpsDevice) {
  // Never dereferenced: the device check comes first.
  Grads g({4, 4});
  g.tensors[1] = Tensor(g.data[1].data(), DType::kF32, {4}, Device::Cuda(0));
  const auto ops = kernels::MakeCpuOps();
  ::ztrain::testing::ExpectErrorWith<Error>([&] { GradSquaredSum(*ops, g.tensors); },
                                            {"gradient 1", "cuda:0", "every one on cpu"});
}

TEST(GradClipTest, ClipCoefficientAsDeepSpeed) {
  EXPECT_FLOAT_EQ(ClipCoefficient(4.0, 1.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(ClipCoefficient(0.5, 1.0), 1.0f);  // below the threshold: untouched
  EXPECT_EQ(ClipCoefficient(4.0, 0.0), 1.0f);  // gradient_clipping 0: off
  EXPECT_LT(ClipCoefficient(1.0, 1.0), 1.0f);  // norm + 1e-6 > max_norm clips, as DeepSpeed
  EXPECT_EQ(ClipCoefficient(std::numeric_limits<double>::infinity(), 1.0), 1.0f);
}

TEST(GradClipTest, UnscaleAndClipMatchesZeroFormula) {
  // Scaled norm 4096 with loss scale 1024 is a true norm of 4: clip to 1.
  EXPECT_FLOAT_EQ(UnscaleAndClipCoefficient(4096.0, 1024.0, 1.0),
                  static_cast<float>(1.0 / (1024.0 * (4.0 + 1e-6))));
  EXPECT_FLOAT_EQ(UnscaleAndClipCoefficient(512.0, 1024.0, 1.0), 1.0f / 1024.0f);
  EXPECT_FLOAT_EQ(UnscaleAndClipCoefficient(4096.0, 1024.0, 0.0), 1.0f / 1024.0f);
  // With loss scale 1 it is ClipCoefficient.
  EXPECT_EQ(UnscaleAndClipCoefficient(4.0, 1.0, 1.0), ClipCoefficient(4.0, 1.0));
  EXPECT_THROW(UnscaleAndClipCoefficient(1.0, 0.0, 1.0), Error);
}

TEST(GradClipTest, ClippedGradientsHaveMaxNorm) {
  Grads g({1000, 12345});
  const double norm = GlobalNorm(g.tensors);
  const double max_norm = norm / 3.0;
  const float c = ClipCoefficient(norm, max_norm);
  for (auto& d : g.data) {
    for (float& x : d) x *= c;
  }
  EXPECT_NEAR(GlobalNorm(g.tensors), max_norm, 1e-6 * max_norm);
}

}  // namespace
}  // namespace ztrain::optim
