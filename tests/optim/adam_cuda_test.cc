// The Tensor AdamStep and GradSquaredSum on a GPU against the CPU (Note [Adam on tensors]).
//
// Each case runs several steps on the GPU and with the scalar CPU kernel
// (AdamImpl::kScalar) from the same state and gradients (bf16 gradients rounded first, so both
// see the same values). The GPU kernel performs the scalar kernel's float operations in its
// order, so the two should agree bit for bit; the test allows kUlps = 2 float ulps of
// max(|cpu|, floor) per element (floor: lr for param, 1e-3 for m, 0 for v), so that a
// mistake of a full term still fails. param_copy must be exactly the GPU's new param
// (rounded to nearest-even for bf16). Without a GPU every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../kernels/cuda_test_util.h"
#include "kernels/ops.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"

namespace ztrain::optim {
namespace {

using kernels::testing::DeviceTensor;
using kernels::testing::RoundTo;

constexpr int kSteps = 4;
constexpr double kUlps = 2.0;

std::vector<float> Random(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Case {
  std::string name;
  AdamStepArgs args;
  int64_t n;
  DType grad_dtype;
  bool has_copy;
  DType copy_dtype;
  int64_t offset = 0;  // a view this many elements into its buffers (1: no 16-byte access)
};

// Every element within kUlps of the CPU's; reports the first few that are not.
void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, double floor,
                const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const double tol = kUlps * FLT_EPSILON * std::max<double>(std::abs(want[i]), floor);
    if (!(std::abs(double{got[i]} - want[i]) <= tol)) {
      ADD_FAILURE() << what << "[" << i << "]: gpu " << got[i] << ", cpu " << want[i];
      ++bad;
    }
  }
}

class AdamCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device visible: the GPU AdamStep is compared with the CPU one "
                      "only on a machine with a GPU";
    }
    gpu_ = kernels::MakeCudaOps(0);
  }

  // Device buffers of offset + n elements, seen from element `offset` on.
  static Tensor View(const DeviceTensor& d, int64_t offset, int64_t n) {
    return d.tensor().Flat(offset, {n});
  }
  static std::vector<float> Tail(std::vector<float> v, int64_t offset) {
    return std::vector<float>(v.begin() + offset, v.end());
  }

  void Run(const Case& c) {
    SCOPED_TRACE(c.name);
    const int64_t n = c.n, total = c.offset + n;
    std::vector<float> p = Random(total, 1, -1.0f, 1.0f), m = Random(total, 2, -0.1f, 0.1f);
    std::vector<float> v = Random(total, 3, 0.0f, 0.01f);
    DeviceTensor dp(p, {total}, DType::kF32), dm(m, {total}, DType::kF32);
    DeviceTensor dv(v, {total}, DType::kF32);
    DeviceTensor dcopy({total}, c.copy_dtype);  // NaN-filled: a skipped element shows
    const Tensor copy = c.has_copy ? View(dcopy, c.offset, n) : Tensor();
    p = Tail(p, c.offset);
    m = Tail(m, c.offset);
    v = Tail(v, c.offset);
    for (int k = 0; k < kSteps; ++k) {
      AdamStepArgs args = c.args;
      args.step = k + 1;
      const std::vector<float> g = RoundTo(c.grad_dtype, Random(total, 10 + k, -1.5f, 1.5f));
      const DeviceTensor dg(g, {total}, c.grad_dtype);
      AdamStep(*gpu_, args, View(dp, c.offset, n), View(dg, c.offset, n), View(dm, c.offset, n),
               View(dv, c.offset, n), copy);
      AdamStep(args, p.data(), g.data() + c.offset, m.data(), v.data(), n, AdamImpl::kScalar);
    }
    const std::vector<float> gpu_p = Tail(dp.ToHost(), c.offset);
    ExpectNear(gpu_p, p, c.args.lr, "param");
    ExpectNear(Tail(dm.ToHost(), c.offset), m, 1e-3, "m");
    ExpectNear(Tail(dv.ToHost(), c.offset), v, 0.0, "v");
    if (c.has_copy) ExpectCopy(Tail(dcopy.ToHost(), c.offset), gpu_p, c.copy_dtype);
  }

  static void ExpectCopy(const std::vector<float>& copy, const std::vector<float>& p, DType dtype) {
    const std::vector<float> want = RoundTo(dtype, p);
    int bad = 0;
    for (size_t i = 0; i < p.size() && bad < 5; ++i) {
      if (FloatBits(copy[i]) != FloatBits(want[i])) {
        ADD_FAILURE() << "param_copy[" << i << "] = " << copy[i] << ", param " << p[i];
        ++bad;
      }
    }
  }

  std::unique_ptr<kernels::Ops> gpu_;
};

AdamStepArgs AdamW() {
  AdamStepArgs args;
  args.lr = 1e-2f;
  args.weight_decay = 0.1f;
  return args;
}

TEST_F(AdamCudaTest, MatchesScalarCpuAcrossVariants) {
  AdamStepArgs l2 = AdamW(), no_decay = AdamW(), no_bias = AdamW(), scaled = AdamW();
  l2.adam_w_mode = false;
  no_decay.weight_decay = 0.0f;
  no_bias.bias_correction = false;
  scaled.grad_scale = 0.37f;
  const DType f32 = DType::kF32, bf16 = DType::kBF16;
  for (const Case& c : std::vector<Case>{
           {"adamw", AdamW(), 4099, f32, false, f32},
           {"l2 bf16 copy", l2, 4099, f32, true, bf16},
           {"no decay fp32 copy", no_decay, 1001, f32, true, f32},
           {"no bias correction", no_bias, 4096, f32, true, bf16},
           {"grad_scale bf16 grad", scaled, 4099, bf16, true, bf16},
           {"l2 bf16 grad", l2, 7, bf16, false, f32},
           {"one element", scaled, 1, f32, true, bf16},
           {"unaligned view", scaled, 4099, bf16, true, bf16, /*offset=*/1},
           {"grid-stride (> 8192 x 256 x 4)", l2, 9000003, bf16, true, bf16},
       }) {
    Run(c);
  }
}

TEST_F(AdamCudaTest, RejectsTheCpuOpsAndMixedDevices) {
  DeviceTensor a(std::vector<float>(4, 0.5f), {4}, DType::kF32);
  DeviceTensor b(std::vector<float>(4, 0.5f), {4}, DType::kF32);
  DeviceTensor c(std::vector<float>(4, 0.5f), {4}, DType::kF32);
  const auto cpu = kernels::MakeCpuOps();
  EXPECT_THROW(AdamStep(*cpu, AdamStepArgs(), a, b, c, b), Error);
  std::vector<float> host(4);
  const Tensor on_host(host.data(), DType::kF32, {4});
  EXPECT_THROW(AdamStep(*gpu_, AdamStepArgs(), a, on_host, b, c), Error);
  EXPECT_EQ(a.ToHost(), std::vector<float>(4, 0.5f));  // nothing was enqueued
}

TEST_F(AdamCudaTest, GradSquaredSumOnDeviceMatchesHost) {
  std::vector<std::vector<float>> host;
  std::vector<DeviceTensor> device;
  std::vector<Tensor> host_t, device_t;
  for (int64_t n : {0, 1, 17, 65537, 1000003}) {
    host.push_back(Random(n, 30 + static_cast<uint32_t>(n), -1e-2f, 1e-2f));
    device.emplace_back(host.back(), Shape{n}, DType::kF32);
  }
  for (size_t i = 0; i < host.size(); ++i) {
    host_t.emplace_back(host[i].data(), DType::kF32, Shape{static_cast<int64_t>(host[i].size())});
    device_t.push_back(device[i].tensor());
  }
  const double want = GradSquaredSum(host_t);
  EXPECT_NEAR(GradSquaredSum(*gpu_, device_t), want, 1e-12 * want);
}

}  // namespace
}  // namespace ztrain::optim
