// The CUDA backend's mixed dtypes (Note [Mixed dtypes on CUDA] in kernels/cuda/widen.h) against
// the CPU backend, which path each call takes (checked without a GPU), and the lazily opened
// cuBLAS (Note [Lazy GPU libraries] in core/lazy_library.h). The one-dtype cross-backend test
// of every op is cuda_ops_test.cc. Without a GPU the GPU tests skip.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "half_test_util.h"
#include "kernel_test_util.h"
#include "kernels/cuda/widen.h"
#include "kernels/ops.h"

namespace ztrain::kernels {
namespace {

using testing::DeviceTensor;
using testing::ExpectClose;
using testing::ExpectErrorMentions;
using testing::Random;
using testing::RandomInts;
using testing::RoundTo;
using testing::ToDouble;
using testing::View;

// cuBLAS is not linked but opened by the first call (Note [Lazy GPU libraries] in
// core/lazy_library.h): the forwarding definitions reach the library's own functions, GPU or
// not (without one, creating a handle fails with cuBLAS's status rather than a crash).
TEST(LazyCublasTest, TheForwardersReachTheLibrary) {
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_NE(std::string(cublasGetStatusString(CUBLAS_STATUS_SUCCESS)), "");
  cublasHandle_t handle = nullptr;
  const cublasStatus_t status = cublasCreate(&handle);
  if (CudaDeviceCount() > 0) {
    ASSERT_EQ(status, CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
  } else {
    EXPECT_NE(status, CUBLAS_STATUS_SUCCESS) << "a cuBLAS handle without a GPU";
  }
}

// Which calls the CUDA kernels take directly and which go through the widening adapter
// (Note [Mixed dtypes on CUDA]): a host-side decision, checked without a GPU.
TEST(CudaMixedDispatchTest, OneDtypeAndFp32GradientsRunDirectly) {
  float storage[4] = {};
  auto t = [&](DType d) { return Tensor(storage, d, {1}, Device::Cuda(0)); };
  const Tensor f32 = t(DType::kF32), bf16 = t(DType::kBF16), f16 = t(DType::kF16);
  const Tensor i32 = t(DType::kI32), none;
  using cuda::NeedsWidening;
  EXPECT_FALSE(NeedsWidening({bf16, bf16, bf16}));
  EXPECT_FALSE(NeedsWidening({f16, f16}, {f16, f32}));   // fp32 or the inputs' gradients
  EXPECT_FALSE(NeedsWidening({bf16, bf16}, {f32, f32}));  // mixed precision's backward
  EXPECT_FALSE(NeedsWidening({bf16, none}, {none}));      // undefined tensors do not count
  EXPECT_TRUE(NeedsWidening({bf16, f32}));
  EXPECT_TRUE(NeedsWidening({f32, f16, f32}));
  EXPECT_TRUE(NeedsWidening({bf16, bf16}, {f16}));  // a 16-bit gradient of another dtype
  EXPECT_TRUE(NeedsWidening({f32, f32}, {bf16}));   // fp32 inputs, 16-bit gradient
  // A non-float tensor goes to the kernels, whose checks name it (no endless widening).
  EXPECT_FALSE(NeedsWidening({bf16, i32}));
  EXPECT_FALSE(NeedsWidening({bf16}, {i32}));
}

// The engine's dtype mixes on the GPU (Note [Mixed dtypes on CUDA] in kernels/cuda/widen.h):
// each op runs on the CPU on host tensors of the mix's dtypes (the CPU backend takes every
// combination and gives the fp32 op on the widened values, rounded once: half_ops_test.cc)
// and on the GPU on device copies of the same tensors. Each output agrees at its own dtype's
// tolerance, every input comes back bit for bit, and outputs start from the same random
// values on both sides, so a skipped write or accumulation shows. The mixes cover both GPU
// paths: one dtype, and 16-bit inputs with fp32 gradients, run the kernels directly; the
// scrambled ones go through the widening adapter.
class CudaMixedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    cpu_ = MakeCpuOps();
    gpu_ = MakeCudaOps(0);
  }

  static std::vector<uint8_t> BytesOf(const testing::HostTensor& t) {
    std::vector<uint8_t> bytes(static_cast<size_t>(t.numel()) * DTypeSize(t.dtype()));
    std::memcpy(bytes.data(), t.tensor().data(), bytes.size());
    return bytes;
  }

  void ForEveryMix(const std::vector<testing::ArgSpec>& specs, const testing::OpCall& op) {
    using testing::Role;
    uint32_t seed = 100;
    for (const testing::DtypeMix& mix : testing::EngineMixes()) {
      SCOPED_TRACE(mix.name);
      seed += 1000;
      std::vector<testing::HostTensor> host;
      std::vector<DeviceTensor> dev;
      std::vector<std::vector<uint8_t>> before;
      std::vector<Tensor> host_t, dev_t;
      for (size_t i = 0; i < specs.size(); ++i) {
        host.push_back(testing::RandomArg(specs[i], mix, seed, i));
        before.push_back(BytesOf(host.back()));
        dev.emplace_back(before.back(), specs[i].shape, host.back().dtype());
      }
      for (size_t i = 0; i < specs.size(); ++i) {
        host_t.push_back(host[i].tensor());
        dev_t.push_back(dev[i].tensor());
      }
      op(*cpu_, host_t);
      op(*gpu_, dev_t);
      for (size_t i = 0; i < specs.size(); ++i) {
        const Role r = specs[i].role;
        const DType dtype = host[i].dtype();
        const std::string what =
            std::string(specs[i].name) + " (" + std::string(DTypeName(dtype)) + ")";
        if (r == Role::kAct || r == Role::kParam || r == Role::kStat || r == Role::kIndex) {
          EXPECT_EQ(dev[i].Bytes(), before[i]) << what << " is an input but was changed";
          continue;
        }
        const std::vector<float> want = host[i].Values();
        ExpectClose(dev[i].ToHost(), ToDouble(want), testing::CrossBackendTolerance(dtype), what);
      }
    }
  }

  std::unique_ptr<Ops> cpu_, gpu_;
};

constexpr int64_t kMixB = 2, kMixT = 70, kMixC = 48, kMixN = kMixB * kMixT, kMixVp = 11;
constexpr AttentionHeads kMixGqa{4, 2, 16};

TEST_F(CudaMixedTest, GemmAndLinear) {
  using testing::Role;
  const int64_t oc = 40;
  for (float beta : {0.0f, 0.5f}) {
    SCOPED_TRACE("beta=" + std::to_string(beta));
    ForEveryMix({{"a", Role::kAct, {kMixN, kMixC}},
                 {"b", Role::kAct, {oc, kMixC}},
                 {"c", Role::kGrad, {kMixN, oc}}},
                [&](Ops& o, const auto& v) { o.Gemm(false, true, 0.75f, v[0], v[1], beta, v[2]); });
  }
  ForEveryMix({{"x", Role::kAct, {kMixN, kMixC}},
               {"weight", Role::kParam, {oc, kMixC}},
               {"bias", Role::kParam, {oc}},
               {"y", Role::kOut, {kMixN, oc}}},
              [](Ops& o, const auto& v) { o.LinearForward(v[0], v[1], v[2], v[3]); });
  ForEveryMix({{"dy", Role::kAct, {kMixN, oc}},
               {"x", Role::kAct, {kMixN, kMixC}},
               {"weight", Role::kParam, {oc, kMixC}},
               {"dx", Role::kOut, {kMixN, kMixC}},
               {"dweight", Role::kGrad, {oc, kMixC}},
               {"dbias", Role::kGrad, {oc}}},
              [](Ops& o, const auto& v) { o.LinearBackward(v[0], v[1], v[2], v[3], v[4], v[5]); });
}

TEST_F(CudaMixedTest, EmbeddingAndNorms) {
  using testing::Role;
  const int64_t maxt = kMixT + 3;
  ForEveryMix({{"tokens", Role::kIndex, {kMixB, kMixT}, kMixVp},
               {"wte", Role::kParam, {kMixVp, kMixC}},
               {"wpe", Role::kParam, {maxt, kMixC}},
               {"out", Role::kOut, {kMixB, kMixT, kMixC}}},
              [](Ops& o, const auto& v) { o.EmbeddingForward(v[0], v[1], v[2], v[3]); });
  ForEveryMix({{"dout", Role::kAct, {kMixB, kMixT, kMixC}},
               {"tokens", Role::kIndex, {kMixB, kMixT}, 3},
               {"dwte", Role::kGrad, {kMixVp, kMixC}},
               {"dwpe", Role::kGrad, {maxt, kMixC}}},
              [](Ops& o, const auto& v) { o.EmbeddingBackward(v[0], v[1], v[2], v[3]); });
  ForEveryMix({{"x", Role::kAct, {kMixN, kMixC}},
               {"weight", Role::kParam, {kMixC}},
               {"bias", Role::kParam, {kMixC}},
               {"y", Role::kOut, {kMixN, kMixC}},
               {"mean", Role::kStatOut, {kMixN}},
               {"rstd", Role::kStatOut, {kMixN}}},
              [](Ops& o, const auto& v) { o.LayerNormForward(v[0], v[1], v[2], v[3], v[4], v[5]); });
  // The statistics a forward pass of the same x would save: the backward reads them.
  ForEveryMix({{"dy", Role::kAct, {kMixN, kMixC}},
               {"x", Role::kAct, {kMixN, kMixC}},
               {"weight", Role::kParam, {kMixC}},
               {"mean", Role::kStat, {kMixN}},
               {"rstd", Role::kStat, {kMixN}},
               {"dx", Role::kOut, {kMixN, kMixC}},
               {"dweight", Role::kGrad, {kMixC}},
               {"dbias", Role::kGrad, {kMixC}}},
              [](Ops& o, const auto& v) {
                o.LayerNormBackward(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
              });
  ForEveryMix({{"x", Role::kAct, {kMixN, kMixC}},
               {"weight", Role::kParam, {kMixC}},
               {"y", Role::kOut, {kMixN, kMixC}},
               {"rstd", Role::kStatOut, {kMixN}}},
              [](Ops& o, const auto& v) { o.RmsNormForward(v[0], v[1], 1e-5f, v[2], v[3]); });
  ForEveryMix({{"dy", Role::kAct, {kMixN, kMixC}},
               {"x", Role::kAct, {kMixN, kMixC}},
               {"weight", Role::kParam, {kMixC}},
               {"rstd", Role::kStat, {kMixN}},
               {"dx", Role::kOut, {kMixN, kMixC}},
               {"dweight", Role::kGrad, {kMixC}}},
              [](Ops& o, const auto& v) { o.RmsNormBackward(v[0], v[1], v[2], v[3], v[4], v[5]); });
}

TEST_F(CudaMixedTest, AttentionAndRope) {
  using testing::Role;
  const int64_t width = kMixGqa.qkv_width();
  ForEveryMix({{"qkv", Role::kAct, {kMixB, kMixT, width}},
               {"out", Role::kOut, {kMixB, kMixT, kMixGqa.q_width()}},
               {"lse", Role::kStatOut, {kMixB, kMixGqa.num_heads, kMixT}}},
              [](Ops& o, const auto& v) { o.AttentionForward(v[0], kMixGqa, v[1], v[2]); });
  ForEveryMix({{"dout", Role::kAct, {kMixB, kMixT, kMixGqa.q_width()}},
               {"qkv", Role::kAct, {kMixB, kMixT, width}},
               {"out", Role::kAct, {kMixB, kMixT, kMixGqa.q_width()}},
               {"lse", Role::kStat, {kMixB, kMixGqa.num_heads, kMixT}},
               {"dqkv", Role::kOut, {kMixB, kMixT, width}}},
              [](Ops& o, const auto& v) {
                o.AttentionBackward(v[0], v[1], v[2], v[3], kMixGqa, v[4]);
              });
  ForEveryMix({{"qkv", Role::kActInOut, {kMixB, kMixT, width}},
               {"inv_freq", Role::kStat, {kMixGqa.head_dim / 2}}},
              [](Ops& o, const auto& v) { o.RopeForward(v[0], kMixGqa, v[1]); });
  ForEveryMix({{"dqkv", Role::kActInOut, {kMixB, kMixT, width}},
               {"inv_freq", Role::kStat, {kMixGqa.head_dim / 2}}},
              [](Ops& o, const auto& v) { o.RopeBackward(v[0], kMixGqa, v[1]); });
}

TEST_F(CudaMixedTest, ElementwiseAndLoss) {
  using testing::Role;
  const int64_t n = 5000;
  ForEveryMix({{"gate", Role::kAct, {n}}, {"up", Role::kAct, {n}}, {"h", Role::kOut, {n}}},
              [](Ops& o, const auto& v) { o.SwiGluForward(v[0], v[1], v[2]); });
  ForEveryMix({{"dh", Role::kAct, {n}},
               {"gate", Role::kAct, {n}},
               {"up", Role::kAct, {n}},
               {"dgate", Role::kOut, {n}},
               {"dup", Role::kOut, {n}}},
              [](Ops& o, const auto& v) { o.SwiGluBackward(v[0], v[1], v[2], v[3], v[4]); });
  ForEveryMix({{"x", Role::kAct, {n}}, {"y", Role::kOut, {n}}},
              [](Ops& o, const auto& v) { o.GeluForward(v[0], v[1]); });
  ForEveryMix({{"dy", Role::kAct, {n}}, {"x", Role::kAct, {n}}, {"dx", Role::kOut, {n}}},
              [](Ops& o, const auto& v) { o.GeluBackward(v[0], v[1], v[2]); });
  ForEveryMix({{"a", Role::kAct, {n}}, {"b", Role::kParam, {n}}, {"y", Role::kOut, {n}}},
              [](Ops& o, const auto& v) { o.Add(v[0], v[1], v[2]); });
  ForEveryMix({{"y", Role::kActInOut, {n}}, {"x", Role::kParam, {n}}},
              [](Ops& o, const auto& v) { o.AddInPlace(v[0], v[1]); });
  ForEveryMix({{"dweight", Role::kGrad, {n}}},
              [](Ops& o, const auto& v) { o.Scale(v[0], -0.3f); });
  const int64_t rows = 6, vocab = 1000, padded = 1024;
  ForEveryMix({{"logits", Role::kActInOut, {rows, padded}},
               {"targets", Role::kIndex, {rows}, static_cast<int32_t>(vocab)},
               {"losses", Role::kStatOut, {rows}},
               {"dlosses", Role::kStat, {rows}}},
              [&](Ops& o, const auto& v) { o.SoftmaxCrossEntropy(v[0], v[1], vocab, v[2], v[3]); });
}

// Copy converts between the float dtypes as the CPU backend does, bit for bit (one rounding
// to nearest even), whichever side is host memory; a conversion that would overlap is refused.
TEST_F(CudaMixedTest, CopyConvertsLikeTheCpu) {
  const int64_t n = 3001;
  std::vector<float> v = testing::Random(n, 9, -70000.0f, 70000.0f);  // past fp16's range too
  v[0] = 1e-40f;  // an fp32 subnormal
  v[1] = 3e-6f;   // an fp16 subnormal
  v[2] = 1.00390625f;  // a bf16 tie: 1 + 2^-8
  const DType types[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (DType from : types) {
    for (DType to : types) {
      const std::string pair = std::string(DTypeName(from)) + " -> " + std::string(DTypeName(to));
      SCOPED_TRACE(pair);
      const testing::HostTensor src = testing::HostTensor::From(from, {n}, v);
      testing::HostTensor want(to, {n});
      cpu_->Copy(src.tensor(), want.tensor());
      const std::vector<uint8_t> want_bytes = BytesOf(want);
      DeviceTensor dsrc(BytesOf(src), {n}, from), ddst({n}, to);
      gpu_->Copy(dsrc, ddst);  // device to device
      EXPECT_EQ(ddst.Bytes(), want_bytes) << "device to device";
      DeviceTensor ddst2({n}, to);
      gpu_->Copy(src.tensor(), ddst2);  // host to device
      EXPECT_EQ(ddst2.Bytes(), want_bytes) << "host to device";
      testing::HostTensor back(to, {n});
      gpu_->Copy(dsrc, back.tensor());  // device to host
      gpu_->Synchronize();
      EXPECT_EQ(BytesOf(back), want_bytes) << "device to host";
    }
  }
  // More than one chunk of a host-side conversion (Copy stages 2^22 elements at a time).
  const int64_t big = (int64_t{1} << 22) + 1001;
  const testing::HostTensor host32 =
      testing::HostTensor::From(DType::kF32, {big}, testing::Random(big, 10));
  testing::HostTensor want16(DType::kBF16, {big}), back32(DType::kF32, {big});
  cpu_->Copy(host32.tensor(), want16.tensor());
  DeviceTensor dev16({big}, DType::kBF16);
  gpu_->Copy(host32.tensor(), dev16);  // host fp32 -> device bf16, chunked
  EXPECT_EQ(dev16.Bytes(), BytesOf(want16)) << "host to device, several chunks";
  gpu_->Copy(dev16, back32.tensor());  // device bf16 -> host fp32, chunked
  gpu_->Synchronize();
  const testing::HostTensor want32 =
      testing::HostTensor::From(DType::kF32, {big}, want16.Values());
  EXPECT_EQ(BytesOf(back32), BytesOf(want32)) << "device to host, several chunks";

  DeviceTensor wide({8}, DType::kF32);
  const Tensor& t = wide.tensor();
  const Tensor narrow_alias(t.data(), DType::kBF16, {8}, t.device());
  ExpectErrorMentions([&] { gpu_->Copy(t, narrow_alias); }, {"Copy", "overlap"});
}

// A mixed call on empty tensors goes through the adapter and does nothing, as the one-dtype
// call does (its fp32 views are defined, just empty).
TEST_F(CudaMixedTest, EmptyMixedCallsDoNothing) {
  DeviceTensor backing({64}, DType::kF32);  // empty views need a (defined) address
  auto empty = [&](Shape shape, DType dtype) {
    return Tensor(backing.tensor().data(), dtype, std::move(shape), Device::Cuda(0));
  };
  const std::vector<uint8_t> before = backing.Bytes();
  DeviceTensor w(std::vector<float>(8, 1.0f), {8}, DType::kF32),
      b(std::vector<float>(8, 0.0f), {8}, DType::kF32);
  const Tensor x = empty({0, 8}, DType::kBF16), y = empty({0, 8}, DType::kBF16);
  EXPECT_NO_THROW(gpu_->LayerNormForward(x, w, b, y, empty({0}, DType::kF32),
                                         empty({0}, DType::kF32)));
  EXPECT_NO_THROW(gpu_->Add(x, empty({0, 8}, DType::kF16), y));
  EXPECT_EQ(backing.Bytes(), before) << "an empty call wrote something";
}

// The adapter's device scratch is what ScratchBytes counts beyond the workspace: it grows by
// the widened arguments' fp32 bytes on a mixed call that goes through the adapter, and a
// repeat of the call reuses it.
TEST_F(CudaMixedTest, ScratchBytesCountsTheAdaptersBuffers) {
  const int64_t n = 1 << 16;
  DeviceTensor a(testing::Random(n, 1), {n}, DType::kBF16), b(testing::Random(n, 2), {n}, DType::kF16);
  DeviceTensor y({n}, DType::kF32);
  const int64_t before = gpu_->ScratchBytes();
  gpu_->Add(a, b, y);  // bf16 + fp16 -> fp32: a and b widened
  const int64_t after = gpu_->ScratchBytes();
  EXPECT_GE(after - before, 2 * n * 4);
  gpu_->Add(a, b, y);
  EXPECT_EQ(gpu_->ScratchBytes(), after);
}

}  // namespace
}  // namespace ztrain::kernels
