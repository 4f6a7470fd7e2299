// CUDA attention against the CPU's (the cross-backend test's model, cuda_ops_test.cc):
// forward (out, lse) and backward (every dqkv element written) on every case of
// attention_cases.h, for the fp32-arithmetic kernels and the tensor-core ones (Note
// [Tensor-core attention]). Grouped-query attention sums dK and dV over the NH / NKV query
// heads of a group: more terms in fp32, no extra rounding in bf16, so the dtypes' tolerances
// stay. Without a GPU every test skips.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "attention_cases.h"
#include "cuda_test_util.h"
#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace ztrain::kernels {
namespace {

using testing::AttnCase;
using testing::DeviceTensor;
using testing::kAttnCases;
using testing::RoundTo;
using testing::View;

class CudaAttentionTest : public testing::CrossBackendTest {
 protected:
  // Every case of kAttnCases on `gpu` against the CPU.
  void CheckAttentionCases(Ops& gpu);
};

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaAttentionTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         testing::DTypeParamName);

// Every attention case on `gpu` against the CPU: forward (out, lse) and backward (dqkv, every
// element written) from the CPU's out and lse.
void CudaAttentionTest::CheckAttentionCases(Ops& gpu) {
  for (const AttnCase& tc : kAttnCases) {
    SCOPED_TRACE(tc.Name());
    const Shape qkv_shape = tc.qkv(), out_shape = tc.out(), lse_shape = tc.lse();
    auto qkv = Rand(NumElements(qkv_shape), 1, -2.0f, 2.0f);
    auto dout = Rand(NumElements(out_shape), 2);
    std::vector<float> out(NumElements(out_shape)), lse(NumElements(lse_shape));
    std::vector<float> dqkv(qkv.size(), 123.0f);  // overwritten, not accumulated
    DeviceTensor gqkv = Dev(qkv, qkv_shape), gout = Out(out_shape), glse = OutF32(lse_shape);
    // Multi-head cases go through GPT-2's form (int num_heads) on the GPU.
    const bool mha = tc.heads.num_kv_heads == tc.heads.num_heads;
    cpu_->AttentionForward(View(qkv, qkv_shape), tc.heads, View(out, out_shape),
                           View(lse, lse_shape));
    if (mha) {
      gpu.AttentionForward(gqkv, tc.heads.num_heads, gout, glse);
    } else {
      gpu.AttentionForward(gqkv, tc.heads, gout, glse);
    }
    Expect(gout, out, "out");
    Expect(glse, lse, "lse", 1e-4);  // fp32 on both sides from the same inputs
    // Both backwards take the CPU's out (rounded to the dtype) and lse.
    out = RoundTo(dtype(), out);
    DeviceTensor cout = Dev(out, out_shape), clse = DevF32(lse, lse_shape);
    DeviceTensor gdout = Dev(dout, out_shape), gdqkv = Dev(dqkv, qkv_shape);
    cpu_->AttentionBackward(View(dout, out_shape), View(qkv, qkv_shape), View(out, out_shape),
                            View(lse, lse_shape), tc.heads, View(dqkv, qkv_shape));
    if (mha) {
      gpu.AttentionBackward(gdout, gqkv, cout, clse, tc.heads.num_heads, gdqkv);
    } else {
      gpu.AttentionBackward(gdout, gqkv, cout, clse, tc.heads, gdqkv);
    }
    Expect(gdqkv, dqkv, "dqkv");
  }
}

TEST_P(CudaAttentionTest, AttentionForwardAndBackwardMatchCpu) { CheckAttentionCases(*gpu_); }

// The tensor-core kernels (Note [Tensor-core attention]) on the same cases, and their backward
// bit for bit the same when run twice. Their P and dS are rounded to the dtype before the
// products (FlashAttention's rounding), one more rounding of each term that the dtype's
// tolerance covers.
TEST_P(CudaAttentionTest, TensorCoreAttentionMatchesCpu) {
  if (dtype() == DType::kF32) GTEST_SKIP() << "tensor cores take bf16 and fp16 only";
  const std::unique_ptr<Ops> tensor_cores = MakeCudaOps(0, {.tensor_core_attention = true});
  CheckAttentionCases(*tensor_cores);
  const AttnCase& c = kAttnCases[6];  // 8 query heads over 2 KV heads, T = 100, HS = 128
  auto qkv = Rand(NumElements(c.qkv()), 3), dout = Rand(NumElements(c.out()), 4);
  DeviceTensor gqkv = Dev(qkv, c.qkv()), gdout = Dev(dout, c.out()), gout = Out(c.out());
  DeviceTensor glse = OutF32(c.lse());
  tensor_cores->AttentionForward(gqkv, c.heads, gout, glse);
  auto backward = [&] {
    DeviceTensor gdqkv = Out(c.qkv());
    tensor_cores->AttentionBackward(gdout, gqkv, gout, glse, c.heads, gdqkv);
    return gdqkv.Bytes();
  };
  EXPECT_EQ(backward(), backward()) << "the tensor-core backward is not deterministic";
}

}  // namespace
}  // namespace ztrain::kernels
