#include "nn/init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace ztrain::nn {
namespace {

ParamSpec NormalSpec(const char* name, float std) {
  ParamSpec s;
  s.name = name;
  s.shape = {4096};
  s.init = Init::kNormal;
  s.init_std = std;
  return s;
}

TEST(InitTest, ShardsSeeExactlyTheWholeParameterValues) {
  const ParamSpec spec = NormalSpec("h.0.attn.c_attn.weight", 0.02f);
  std::vector<float> whole(4096), shard(1000);
  InitParam(spec, 42, Tensor(whole.data(), DType::kF32, {4096}));
  InitParam(spec, 42, Tensor(shard.data(), DType::kF32, {1000}), 1234);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(shard[i], whole[1234 + i]);
}

TEST(InitTest, DependsOnSeedAndNameAndHasTheRequestedMoments) {
  std::vector<float> a(4096), b(4096), c(4096);
  InitParam(NormalSpec("wte", 0.5f), 1, Tensor(a.data(), DType::kF32, {4096}));
  InitParam(NormalSpec("wte", 0.5f), 2, Tensor(b.data(), DType::kF32, {4096}));
  InitParam(NormalSpec("wpe", 0.5f), 1, Tensor(c.data(), DType::kF32, {4096}));
  int same_ab = 0, same_ac = 0;
  double sum = 0, sq = 0;
  for (int i = 0; i < 4096; ++i) {
    same_ab += a[i] == b[i];
    same_ac += a[i] == c[i];
    sum += a[i];
    sq += double(a[i]) * a[i];
  }
  EXPECT_LT(same_ab, 5);
  EXPECT_LT(same_ac, 5);
  const double mean = sum / 4096, std = std::sqrt(sq / 4096 - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.5 * 4 / std::sqrt(4096.0));  // 4 standard errors
  EXPECT_NEAR(std, 0.5, 0.03);
}

TEST(InitTest, ZerosAndOnes) {
  ParamSpec s = NormalSpec("ln_f.weight", 0.f);
  s.init = Init::kOnes;
  std::vector<float> v(4096, 3.f);
  InitParam(s, 1, Tensor(v.data(), DType::kF32, {4096}));
  for (float x : v) ASSERT_EQ(x, 1.f);
  s.init = Init::kZeros;
  InitParam(s, 1, Tensor(v.data(), DType::kF32, {4096}));
  for (float x : v) ASSERT_EQ(x, 0.f);
}

}  // namespace
}  // namespace ztrain::nn
