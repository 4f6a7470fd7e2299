// Every CPU op with bf16 and fp16 arguments (all 16-bit, 16-bit with fp32 parameter
// gradients, scrambled mixes; the fixed-fp32 statistics always fp32) against the fp32 op on
// the same rounded inputs. The widening adapter runs the fp32 kernel itself, so the outputs
// must be the fp32 results rounded once to their dtype, bit for bit (0 ulp): a second
// rounding, truncation, a missed accumulation or a dropped output all show. GEMMs run on
// the SGEMM path here (Bf16GemmPath::kSgemm) to be exact too; bf16_gemm_test.cc covers oneDNN.
#include <omp.h>

#include <cmath>
#include <vector>

#include "half_test_util.h"
#include "kernels/cpu/cpu_ops.h"

namespace ztrain::kernels {
namespace {

using testing::ArgSpec;
using testing::DtypeMix;
using testing::EngineMixes;
using testing::ExpectMatchesFp32OnRoundedInputs;
using testing::Role;

class HalfOpsTest : public ::testing::Test {
 protected:
  // Runs `op` under every engine mix (under two of them when `few`, for large sizes);
  // v[i] is the tensor of specs[i].
  void ForEveryMix(const std::vector<ArgSpec>& specs, const testing::OpCall& op, bool few = false) {
    uint32_t seed = 100;
    std::vector<DtypeMix> mixes = EngineMixes();
    if (few) mixes = {mixes.front(), mixes.back()};  // all bf16; and every dtype at once
    for (const DtypeMix& mix : mixes) {
      ExpectMatchesFp32OnRoundedInputs(ops_, specs, mix, op, seed += 1000);
    }
  }
  CpuOps ops_{Bf16GemmPath::kSgemm};
};

constexpr int64_t kB = 2, kT = 70, kC = 32, kNH = 2, kN = kB * kT, kVp = 11, kMaxT = 73;

TEST_F(HalfOpsTest, EmbeddingForwardAndBackward) {
  ForEveryMix({{"tokens", Role::kIndex, {kB, kT}, kVp},
               {"wte", Role::kParam, {kVp, kC}},
               {"wpe", Role::kParam, {kMaxT, kC}},
               {"out", Role::kOut, {kB, kT, kC}}},
              [](Ops& o, const auto& v) { o.EmbeddingForward(v[0], v[1], v[2], v[3]); });
  ForEveryMix({{"dout", Role::kAct, {kB, kT, kC}},
               {"tokens", Role::kIndex, {kB, kT}, 3},
               {"dwte", Role::kGrad, {kVp, kC}},
               {"dwpe", Role::kGrad, {kMaxT, kC}}},
              [](Ops& o, const auto& v) { o.EmbeddingBackward(v[0], v[1], v[2], v[3]); });
  // Without a position table: out is the wte row rounded once, dwte the same sums.
  ForEveryMix({{"tokens", Role::kIndex, {kB, kT}, kVp},
               {"wte", Role::kParam, {kVp, kC}},
               {"out", Role::kOut, {kB, kT, kC}}},
              [](Ops& o, const auto& v) { o.EmbeddingForward(v[0], v[1], Tensor(), v[2]); });
  ForEveryMix({{"dout", Role::kAct, {kB, kT, kC}},
               {"tokens", Role::kIndex, {kB, kT}, 3},
               {"dwte", Role::kGrad, {kVp, kC}}},
              [](Ops& o, const auto& v) { o.EmbeddingBackward(v[0], v[1], v[2], Tensor()); });
}

TEST_F(HalfOpsTest, LayerNormForwardAndBackward) {
  const int64_t ch = 96;
  ForEveryMix(
      {{"x", Role::kAct, {kN, ch}},
       {"weight", Role::kParam, {ch}},
       {"bias", Role::kParam, {ch}},
       {"y", Role::kOut, {kN, ch}},
       {"mean", Role::kStatOut, {kN}},
       {"rstd", Role::kStatOut, {kN}}},
      [](Ops& o, const auto& v) { o.LayerNormForward(v[0], v[1], v[2], v[3], v[4], v[5]); });
  ForEveryMix({{"dy", Role::kAct, {kN, ch}},
               {"x", Role::kAct, {kN, ch}},
               {"weight", Role::kParam, {ch}},
               {"mean", Role::kStat, {kN}},
               {"rstd", Role::kStat, {kN}},
               {"dx", Role::kOut, {kN, ch}},
               {"dweight", Role::kGrad, {ch}},
               {"dbias", Role::kGrad, {ch}}},
              [](Ops& o, const auto& v) {
                o.LayerNormBackward(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
              });
}

TEST_F(HalfOpsTest, RmsNormForwardAndBackward) {
  const int64_t ch = 96;
  ForEveryMix({{"x", Role::kAct, {kN, ch}},
               {"weight", Role::kParam, {ch}},
               {"y", Role::kOut, {kN, ch}},
               {"rstd", Role::kStatOut, {kN}}},
              [](Ops& o, const auto& v) { o.RmsNormForward(v[0], v[1], 1e-5f, v[2], v[3]); });
  ForEveryMix({{"dy", Role::kAct, {kN, ch}},
               {"x", Role::kAct, {kN, ch}},
               {"weight", Role::kParam, {ch}},
               {"rstd", Role::kStat, {kN}},
               {"dx", Role::kOut, {kN, ch}},
               {"dweight", Role::kGrad, {ch}}},
              [](Ops& o, const auto& v) { o.RmsNormBackward(v[0], v[1], v[2], v[3], v[4], v[5]); });
}

// Grouped-query heads (NH = 4, NKV = 2, HS = 8): qkv [B, T, 64], out [B, T, 32].
constexpr AttentionHeads kGqa{4, 2, 8};
constexpr int64_t kGqaWidth = (4 + 2 * 2) * 8;

TEST_F(HalfOpsTest, RopeForwardAndBackwardInPlace) {  // v's columns come back bit for bit
  for (bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "RopeBackward" : "RopeForward");
    ForEveryMix({{"qkv", Role::kActInOut, {kB, kT, kGqaWidth}}, {"inv_freq", Role::kStat, {4}}},
                [&](Ops& o, const auto& v) {
                  if (backward) {
                    o.RopeBackward(v[0], kGqa, v[1]);
                  } else {
                    o.RopeForward(v[0], kGqa, v[1]);
                  }
                });
  }
}

TEST_F(HalfOpsTest, SwiGluForwardAndBackward) {
  for (int64_t n : {int64_t{1000}, cpu::kChunkElements + 123}) {  // and more than one chunk
    SCOPED_TRACE("n=" + std::to_string(n));
    const bool few = n > 1000;
    ForEveryMix(
        {{"gate", Role::kAct, {n}}, {"up", Role::kAct, {n}}, {"h", Role::kOut, {n}}},
        [](Ops& o, const auto& v) { o.SwiGluForward(v[0], v[1], v[2]); }, few);
    ForEveryMix(
        {{"dh", Role::kAct, {n}},
         {"gate", Role::kAct, {n}},
         {"up", Role::kAct, {n}},
         {"dgate", Role::kOut, {n}},
         {"dup", Role::kOut, {n}}},
        [](Ops& o, const auto& v) { o.SwiGluBackward(v[0], v[1], v[2], v[3], v[4]); }, few);
  }
}

TEST_F(HalfOpsTest, GroupedQueryAttentionForwardAndBackward) {
  ForEveryMix({{"qkv", Role::kAct, {kB, kT, kGqaWidth}},
               {"out", Role::kOut, {kB, kT, kGqa.q_width()}},
               {"lse", Role::kStatOut, {kB, kGqa.num_heads, kT}}},
              [](Ops& o, const auto& v) { o.AttentionForward(v[0], kGqa, v[1], v[2]); });
  ForEveryMix(
      {{"dout", Role::kAct, {kB, kT, kGqa.q_width()}},
       {"qkv", Role::kAct, {kB, kT, kGqaWidth}},
       {"out", Role::kAct, {kB, kT, kGqa.q_width()}},
       {"lse", Role::kStat, {kB, kGqa.num_heads, kT}},
       {"dqkv", Role::kOut, {kB, kT, kGqaWidth}}},
      [](Ops& o, const auto& v) { o.AttentionBackward(v[0], v[1], v[2], v[3], kGqa, v[4]); });
}

TEST_F(HalfOpsTest, AttentionForwardAndBackward) {  // T = 70 spans two key tiles
  ForEveryMix({{"qkv", Role::kAct, {kB, kT, 3 * kC}},
               {"out", Role::kOut, {kB, kT, kC}},
               {"lse", Role::kStatOut, {kB, kNH, kT}}},
              [](Ops& o, const auto& v) { o.AttentionForward(v[0], kNH, v[1], v[2]); });
  ForEveryMix(
      {{"dout", Role::kAct, {kB, kT, kC}},
       {"qkv", Role::kAct, {kB, kT, 3 * kC}},
       {"out", Role::kAct, {kB, kT, kC}},
       {"lse", Role::kStat, {kB, kNH, kT}},
       {"dqkv", Role::kOut, {kB, kT, 3 * kC}}},
      [](Ops& o, const auto& v) { o.AttentionBackward(v[0], v[1], v[2], v[3], kNH, v[4]); });
}

TEST_F(HalfOpsTest, ElementwiseOpsAcrossSeveralChunks) {
  // Small, and more than one adapter chunk (cpu::kChunkElements) with a ragged end.
  for (int64_t n : {int64_t{1000}, cpu::kChunkElements + 123}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const bool few = n > 1000;
    ForEveryMix(
        {{"x", Role::kAct, {n}}, {"y", Role::kOut, {n}}},
        [](Ops& o, const auto& v) { o.GeluForward(v[0], v[1]); }, few);
    ForEveryMix(
        {{"dy", Role::kAct, {n}}, {"x", Role::kAct, {n}}, {"dx", Role::kOut, {n}}},
        [](Ops& o, const auto& v) { o.GeluBackward(v[0], v[1], v[2]); }, few);
    ForEveryMix(
        {{"a", Role::kAct, {n}}, {"b", Role::kParam, {n}}, {"y", Role::kOut, {n}}},
        [](Ops& o, const auto& v) { o.Add(v[0], v[1], v[2]); }, few);
    ForEveryMix(
        {{"y", Role::kActInOut, {n}}, {"x", Role::kParam, {n}}},
        [](Ops& o, const auto& v) { o.AddInPlace(v[0], v[1]); }, few);
    ForEveryMix(
        {{"dweight", Role::kGrad, {n}}}, [](Ops& o, const auto& v) { o.Scale(v[0], -0.3f); }, few);
  }
}

TEST_F(HalfOpsTest, AddAllowsTheOutputToAliasAnInput) {
  const int64_t n = 5000;
  testing::HostTensor a = testing::HostTensor::From(DType::kBF16, {n}, testing::Random(n, 1));
  const testing::HostTensor b = testing::HostTensor::From(DType::kBF16, {n}, testing::Random(n, 2));
  const std::vector<float> a0 = a.Values(), b0 = b.Values();
  ops_.Add(a.tensor(), b.tensor(), a.tensor());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a.Get(i), Bf16ToFloat(FloatToBf16(a0[i] + b0[i])));
}

// The adapter's scratch is what ScratchBytes reports (the engine logs it: the tracker does
// not see it): none for fp32 calls, the widened arguments' fp32 bytes after a 16-bit call,
// kept (not grown) by a repeat of the same call.
TEST(HalfOpsScratchTest, ScratchBytesCountsTheWidenedArguments) {
  CpuOps ops(Bf16GemmPath::kSgemm);
  const int64_t n = 4096;
  testing::HostTensor x32 = testing::HostTensor::From(DType::kF32, {n}, testing::Random(n, 1));
  testing::HostTensor y32 = testing::HostTensor::From(DType::kF32, {n}, testing::Random(n, 2));
  ops.GeluForward(x32.tensor(), y32.tensor());
  EXPECT_EQ(ops.ScratchBytes(), 0);
  testing::HostTensor x16 = testing::HostTensor::From(DType::kBF16, {n}, testing::Random(n, 3));
  testing::HostTensor y16 = testing::HostTensor::From(DType::kBF16, {n}, testing::Random(n, 4));
  ops.GeluForward(x16.tensor(), y16.tensor());
  EXPECT_EQ(ops.ScratchBytes(), 2 * n * 4);  // x widened, y's fp32 output
  ops.GeluForward(x16.tensor(), y16.tensor());
  EXPECT_EQ(ops.ScratchBytes(), 2 * n * 4);
  EXPECT_EQ(static_cast<Ops&>(ops).ScratchBytes(), 2 * n * 4);
}

TEST_F(HalfOpsTest, SoftmaxCrossEntropyWithAndWithoutGradient) {
  // 2100 rows of 512 columns: two row blocks of the adapter (2048 rows each).
  for (int64_t rows : {int64_t{7}, int64_t{2100}}) {
    const int64_t vp = 512, vocab = 500;
    const bool few = rows > 7;
    SCOPED_TRACE("rows=" + std::to_string(rows));
    ForEveryMix(
        {{"logits", Role::kActInOut, {rows, vp}},
         {"targets", Role::kIndex, {rows}, static_cast<int32_t>(vocab)},
         {"losses", Role::kStatOut, {rows}},
         {"dlosses", Role::kStat, {rows}}},
        [&](Ops& o, const auto& v) { o.SoftmaxCrossEntropy(v[0], v[1], vocab, v[2], v[3]); }, few);
    ForEveryMix(
        {{"logits", Role::kAct, {rows, vp}},
         {"targets", Role::kIndex, {rows}, static_cast<int32_t>(vocab)},
         {"losses", Role::kStatOut, {rows}}},
        [&](Ops& o, const auto& v) { o.SoftmaxCrossEntropy(v[0], v[1], vocab, v[2], Tensor()); },
        few);
  }
}

TEST_F(HalfOpsTest, GemmAndLinearOnTheSgemmPath) {
  const int64_t m = 13, n = 17, k = 35;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      SCOPED_TRACE("ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
      const Shape a_shape = ta ? Shape{k, m} : Shape{m, k},
                  b_shape = tb ? Shape{n, k} : Shape{k, n};
      ForEveryMix(
          {{"a", Role::kAct, a_shape}, {"b", Role::kParam, b_shape}, {"c", Role::kOut, {m, n}}},
          [&](Ops& o, const auto& v) { o.Gemm(ta, tb, 0.75f, v[0], v[1], 0.0f, v[2]); });
      ForEveryMix(
          {{"a", Role::kAct, a_shape}, {"b", Role::kAct, b_shape}, {"c", Role::kGrad, {m, n}}},
          [&](Ops& o, const auto& v) { o.Gemm(ta, tb, 1.0f, v[0], v[1], -0.5f, v[2]); });
    }
  }
  const int64_t rows = 21, ch = 24, oc = 40;
  ForEveryMix({{"x", Role::kAct, {3, 7, ch}},
               {"weight", Role::kParam, {oc, ch}},
               {"bias", Role::kParam, {oc}},
               {"y", Role::kOut, {3, 7, oc}}},
              [](Ops& o, const auto& v) { o.LinearForward(v[0], v[1], v[2], v[3]); });
  ForEveryMix({{"x", Role::kAct, {rows, ch}},
               {"weight", Role::kParam, {oc, ch}},
               {"y", Role::kOut, {rows, oc}}},
              [](Ops& o, const auto& v) { o.LinearForward(v[0], v[1], Tensor(), v[2]); });
  ForEveryMix({{"dy", Role::kAct, {rows, oc}},
               {"x", Role::kAct, {rows, ch}},
               {"weight", Role::kParam, {oc, ch}},
               {"dx", Role::kOut, {rows, ch}},
               {"dweight", Role::kGrad, {oc, ch}},
               {"dbias", Role::kGrad, {oc}}},
              [](Ops& o, const auto& v) { o.LinearBackward(v[0], v[1], v[2], v[3], v[4], v[5]); });
  ForEveryMix(
      {{"dy", Role::kAct, {rows, 130}},
       {"x", Role::kAct, {rows, ch}},
       {"weight", Role::kParam, {130, ch}},
       {"dweight", Role::kGrad, {130, ch}},
       {"dbias", Role::kGrad, {130}}},
      [](Ops& o, const auto& v) { o.LinearBackward(v[0], v[1], v[2], Tensor(), v[3], v[4]); });
}

TEST_F(HalfOpsTest, SumSquaresSumsTheWidenedValues) {
  const int64_t n = 300001;  // several chunks
  const std::vector<float> v = testing::Random(n, 9, -3.0f, 3.0f);
  for (DType t : {DType::kBF16, DType::kF16}) {
    const testing::HostTensor h = testing::HostTensor::From(t, {n}, v);
    std::vector<float> wide = h.Values();
    double want = 0.0;
    for (float x : wide) want += double{x} * x;
    EXPECT_NEAR(ops_.SumSquares(h.tensor()), want, 1e-12 * want) << DTypeName(t);
  }
  // Squares far beyond fp16's range: the sum is of widened values, in double.
  std::vector<uint16_t> big(3, FloatToHalf(60000.0f));
  EXPECT_EQ(ops_.SumSquares(Tensor(big.data(), DType::kF16, {3})),
            3.0 * double{HalfToFloat(big[0])} * HalfToFloat(big[0]));
}

TEST_F(HalfOpsTest, FixedFp32ArgumentsRefuse16Bit) {
  std::vector<uint16_t> raw(64);
  std::vector<float> f(64);
  const Tensor x(raw.data(), DType::kBF16, {4, 8}), w(raw.data(), DType::kBF16, {8});
  const Tensor stats(raw.data(), DType::kBF16, {4}), ok_stats(f.data(), DType::kF32, {4});
  testing::ExpectErrorMentions([&] { ops_.LayerNormForward(x, w, w, x, stats, ok_stats); },
                               {"LayerNormForward", "mean", "bf16", "fp32"});
  std::vector<int32_t> targets(4, 0);
  const Tensor tgt(targets.data(), DType::kI32, {4});
  testing::ExpectErrorMentions([&] { ops_.SoftmaxCrossEntropy(x, tgt, 8, stats, Tensor()); },
                               {"SoftmaxCrossEntropy", "losses", "bf16"});
}

TEST_F(HalfOpsTest, AThrowingOpLeavesItsOutputsUntouched) {
  std::vector<uint16_t> x(24, 0x3f80), y(24, 0x1234), w(6, 0x3f80);
  std::vector<float> mean(4), rstd(3);  // rstd has the wrong size
  EXPECT_THROW(ops_.LayerNormForward(
                   Tensor(x.data(), DType::kBF16, {4, 6}), Tensor(w.data(), DType::kBF16, {6}),
                   Tensor(w.data(), DType::kBF16, {6}), Tensor(y.data(), DType::kBF16, {4, 6}),
                   Tensor(mean.data(), DType::kF32, {4}), Tensor(rstd.data(), DType::kF32, {3})),
               Error);
  EXPECT_EQ(y, std::vector<uint16_t>(24, 0x1234));
}

TEST_F(HalfOpsTest, GradientReductionsDoNotDependOnThreadCount) {
  const int64_t rows = 256, ch = 192, vocab = 50;
  const testing::HostTensor dout =
      testing::HostTensor::From(DType::kBF16, {4, 64, ch}, testing::Random(rows * ch, 1));
  const testing::HostTensor x =
      testing::HostTensor::From(DType::kBF16, {rows, ch}, testing::Random(rows * ch, 2));
  const testing::HostTensor w =
      testing::HostTensor::From(DType::kBF16, {ch, ch}, testing::Random(ch * ch, 3));
  std::vector<int32_t> tokens = testing::RandomInts(rows, 4, 0, 8);  // many repeats
  auto run = [&] {
    testing::HostTensor dwte(DType::kBF16, {vocab, ch}), dwpe(DType::kF32, {64, ch});
    testing::HostTensor dw(DType::kF32, {ch, ch}), db(DType::kBF16, {ch});
    ops_.EmbeddingBackward(dout.tensor(), Tensor(tokens.data(), DType::kI32, {4, 64}),
                           dwte.tensor(), dwpe.tensor());
    ops_.LinearBackward(dout.tensor().View({rows, ch}), x.tensor(), w.tensor(), Tensor(),
                        dw.tensor(), db.tensor());
    std::vector<float> all = dwte.Values();
    for (const auto* t : {&dwpe, &db}) {  // dw is OpenBLAS's: thread-count dependent
      const auto v = t->Values();
      all.insert(all.end(), v.begin(), v.end());
    }
    all.push_back(static_cast<float>(ops_.SumSquares(dout.tensor())));
    return all;
  };
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = run();
  omp_set_num_threads(3);
  const std::vector<float> three = run();
  omp_set_num_threads(saved);
  EXPECT_EQ(one, three);
}

}  // namespace
}  // namespace ztrain::kernels
