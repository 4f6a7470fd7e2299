// The Tensor AdamStep on host tensors (Note [Adam on tensors]): the same bits as the pointer
// AdamStep, param_copy rounded to nearest-even, and errors that name the argument. The CUDA
// path is compared with the CPU in adam_cuda_test.cc; its error paths that need no GPU
// (tensors on a CUDA device with the wrong ops) are checked here.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../expect_error.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "optim/adam.h"

namespace ztrain::optim {
namespace {

using ::ztrain::testing::ExpectErrorWith;

constexpr int kSteps = 3;

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Tensor Host(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}
Tensor Host(std::vector<uint16_t>& v) {
  return Tensor(v.data(), DType::kBF16, {static_cast<int64_t>(v.size())});
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Optimizer state stepped by one overload or the other, from the same start.
struct State {
  std::vector<float> p, m, v;
  explicit State(int64_t n) : p(Random(n, 1)), m(Random(n, 2)), v(Random(n, 3)) {
    for (float& x : v) x = x * x;  // a second moment is >= 0
  }
};

AdamStepArgs Args(bool adam_w_mode) {
  AdamStepArgs args;
  args.lr = 1e-2f;
  args.weight_decay = 0.1f;
  args.adam_w_mode = adam_w_mode;
  args.grad_scale = 0.37f;
  return args;
}

class AdamTensorTest : public ::testing::Test {
 protected:
  std::unique_ptr<kernels::Ops> ops_ = kernels::MakeCpuOps();
};

TEST_F(AdamTensorTest, Fp32GradMatchesPointerOverloadBitwise) {
  for (bool adam_w : {true, false}) {
    const int64_t n = 100003;
    State tensor(n), pointer(n);
    std::vector<uint16_t> copy(n, 0xffff);
    for (int k = 0; k < kSteps; ++k) {
      AdamStepArgs args = Args(adam_w);
      args.step = k + 1;
      std::vector<float> g = Random(n, 10 + k);
      AdamStep(*ops_, args, Host(tensor.p), Host(g), Host(tensor.m), Host(tensor.v), Host(copy));
      AdamStep(args, pointer.p.data(), g.data(), pointer.m.data(), pointer.v.data(), n);
    }
    EXPECT_TRUE(SameBits(tensor.p, pointer.p) && SameBits(tensor.m, pointer.m) &&
                SameBits(tensor.v, pointer.v));
    EXPECT_TRUE(SameBits(copy, ToBf16(pointer.p)));
  }
}

TEST_F(AdamTensorTest, Bf16GradMatchesPointerOverloadOnWidenedGradient) {
  // More than two 2^20-element chunks, the last one partial.
  const int64_t n = (int64_t{2} << 20) + 1001;
  State tensor(n), pointer(n);
  std::vector<float> copy(n, -1.0f);
  for (int k = 0; k < kSteps; ++k) {
    AdamStepArgs args = Args(true);
    args.step = k + 1;
    std::vector<uint16_t> g16 = ToBf16(Random(n, 20 + k));
    std::vector<float> wide(n);
    for (int64_t i = 0; i < n; ++i) wide[i] = Bf16ToFloat(g16[i]);
    AdamStep(*ops_, args, Host(tensor.p), Host(g16), Host(tensor.m), Host(tensor.v), Host(copy));
    AdamStep(args, pointer.p.data(), wide.data(), pointer.m.data(), pointer.v.data(), n);
  }
  EXPECT_TRUE(SameBits(tensor.p, pointer.p) && SameBits(tensor.m, pointer.m) &&
              SameBits(tensor.v, pointer.v));
  EXPECT_TRUE(SameBits(copy, tensor.p));  // an fp32 param_copy is the master, exactly
}

TEST_F(AdamTensorTest, NoParamCopyLeavesOnlyTheState) {
  State tensor(17), pointer(17);
  std::vector<float> g = Random(17, 4);
  AdamStep(*ops_, Args(true), Host(tensor.p), Host(g), Host(tensor.m), Host(tensor.v));
  AdamStep(Args(true), pointer.p.data(), g.data(), pointer.m.data(), pointer.v.data(), 17);
  EXPECT_TRUE(SameBits(tensor.p, pointer.p));
}

TEST_F(AdamTensorTest, Bf16ParamCopyRoundsToNearestEven) {
  // lr = 0 leaves param unchanged (p - 0 * update), so the copy is bf16 of these values.
  // bf16 keeps 7 mantissa bits: near 1 its ulp is 2^-7 and a tie is 2^-8 above a bf16.
  std::vector<float> p = {
      1.0f + 0x1p-8f,             // tie, 1.0 is even: down     -> 0x3f80
      1.0f + 3 * 0x1p-8f,         // tie, 1 + 2^-6 is even: up  -> 0x3f82
      1.0f + 0x1p-8f + 0x1p-20f,  // above the tie: up          -> 0x3f81
      1.0f + 0x1p-8f - 0x1p-20f,  // below the tie: down        -> 0x3f80
      -(1.0f + 3 * 0x1p-8f),      // negative tie: to even      -> 0xbf82
      0x1.fefffep+127f,           // 0x7f7f7fff, below a tie    -> 0x7f7f
      0x1.fffffep+127f,           // FLT_MAX rounds up to inf   -> 0x7f80
      0.0f,                       //                            -> 0x0000
  };
  const std::vector<uint16_t> want = {0x3f80, 0x3f82, 0x3f81, 0x3f80,
                                      0xbf82, 0x7f7f, 0x7f80, 0x0000};
  const int64_t n = static_cast<int64_t>(p.size());
  std::vector<float> g(n, 1.0f), m(n, 0.0f), v(n, 0.0f);
  std::vector<uint16_t> copy(n, 0xffff);
  AdamStepArgs args;
  args.lr = 0.0f;
  AdamStep(*ops_, args, Host(p), Host(g), Host(m), Host(v), Host(copy));
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(copy[i], want[i]) << "element " << i << " = " << p[i];
  }
}

TEST_F(AdamTensorTest, ErrorsNameTheArgument) {
  std::vector<float> f4(4), f3(3), dummy(4);
  std::vector<uint16_t> h4(4), h3(3);
  const AdamStepArgs args;
  auto step = [&](Tensor p, Tensor g, Tensor m, Tensor v, Tensor copy = Tensor()) {
    AdamStep(*ops_, args, p, g, m, v, copy);
  };
  std::vector<float> a(4), b(4), c(4);
  ExpectErrorWith<Error>([&] { step(Host(h4), Host(f4), Host(a), Host(b)); },
                         {"'param'", "bf16", "fp32"});
  ExpectErrorWith<Error>([&] { step(Host(a), Host(f3), Host(b), Host(c)); },
                         {"'grad'", "3 elements", "4 elements"});
  ExpectErrorWith<Error>([&] { step(Host(a), Host(f4), Host(h4), Host(c)); },
                         {"'m'", "bf16", "expected fp32 with 4 elements"});
  ExpectErrorWith<Error>([&] { step(Host(a), Host(f4), Host(b), Host(f3)); }, {"'v'", "3"});
  ExpectErrorWith<Error>([&] { step(Host(a), Host(f4), Host(b), Host(c), Host(h3)); },
                         {"'param_copy'", "3 elements", "bf16 or fp32 with 4"});
  // The device is checked against param's, before any memory is touched.
  const Tensor on_gpu(dummy.data(), DType::kF32, {4}, Device::Cuda(0));
  ExpectErrorWith<Error>([&] { step(Host(a), on_gpu, Host(b), Host(c)); },
                         {"'grad'", "on cuda:0", "on cpu (as param)"});
  ExpectErrorWith<Error>([&] { step(on_gpu, on_gpu, on_gpu, Host(c)); },
                         {"'v'", "on cpu", "on cuda:0 (as param)"});
  AdamStepArgs step0;
  step0.step = 0;
  ExpectErrorWith<Error>([&] { AdamStep(*ops_, step0, Host(a), Host(f4), Host(b), Host(c)); },
                         {"1-based"});
  EXPECT_TRUE(SameBits(a, std::vector<float>(4)));  // nothing was written
}

TEST_F(AdamTensorTest, CudaTensorsNeedTheCudaOps) {
  // Never dereferenced: the check fails first. With CUDA the CPU ops are refused; without
  // it the build says it has no CUDA. Either way the message names the tensors' device.
  std::vector<float> dummy(4);
  const Tensor t(dummy.data(), DType::kF32, {4}, Device::Cuda(0));
  ExpectErrorWith<Error>([&] { AdamStep(*ops_, AdamStepArgs(), t, t, t, t); }, {"cuda:0"});
  try {
    AdamStep(*ops_, AdamStepArgs(), t, t, t, t);
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("not a CudaOps") != std::string::npos ||
                what.find("no CUDA") != std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace ztrain::optim
