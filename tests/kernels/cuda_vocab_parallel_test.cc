// The cross-backend test of the op set's tensor-parallel pieces (vocab_parallel_test.cc checks
// the CPU versions against the whole ops): the embedding over a vocabulary slice, forward
// into an fp32 partial or the table's dtype and backward into fp32 or 16-bit gradients;
// AddBiasAndResidual; and each step of the vocabulary-parallel cross-entropy, every step fed
// the same statistics on both backends, so that each is compared alone. In fp32, bf16 and
// fp16 (tolerances as cuda_ops_test.cc's). Lookups and the once-rounded sum are the same
// arithmetic on both sides and must match bit for bit; the gradients' sums and the sums of
// exp differ in order and exp implementation. Without a GPU every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernel_test_util.h"
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

constexpr int64_t kB = 3, kT = 7, kC = 40, kN = kB * kT;

class CudaVocabParallelTest : public testing::CrossBackendTest {
 protected:
  // The GPU tensor holds exactly the CPU's values (both as fp32 here, already rounded).
  static void ExpectSame(const DeviceTensor& got, const std::vector<float>& want,
                         const std::string& what) {
    EXPECT_EQ(got.ToHost(), want) << what;
  }
};

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaVocabParallelTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         testing::DTypeParamName);

// Slice 1 of 3 of a padded table of 48 rows: ids [16, 32).
TEST_P(CudaVocabParallelTest, EmbeddingSliceMatchesCpu) {
  constexpr int64_t kVocab = 48, kLocal = 16;
  const VocabSlice slice{kLocal, kVocab};
  auto tokens = RandomInts(kN, 1, 0, int32_t{kVocab});
  tokens[0] = 16;  // the slice's first and last rows take part
  tokens[1] = 31;
  tokens[2] = tokens[5] = 20;  // a repeated token
  const Shape act{kB, kT, kC}, te{kLocal, kC}, pe{kT, kC};
  auto wte = Rand(kLocal * kC, 2), wpe = Rand(kT * kC, 3);
  DeviceTensor gtok(tokens, {kB, kT}), gwte(wte, te, dtype()), gwpe(wpe, pe, dtype());
  for (DType out_dtype : {DType::kF32, dtype()}) {  // the fp32 partial, and the table's dtype
    for (bool positions : {false, true}) {
      SCOPED_TRACE("out " + std::string(DTypeName(out_dtype)) + (positions ? " with wpe" : ""));
      std::vector<float> out(kN * kC);
      DeviceTensor gout(act, out_dtype);
      cpu_->EmbeddingForward(View(tokens, {kB, kT}), View(wte, te),
                             positions ? View(wpe, pe) : Tensor(), View(out, act), slice);
      gpu_->EmbeddingForward(gtok, gwte, positions ? static_cast<const Tensor&>(gwpe) : Tensor(),
                             gout, slice);
      ExpectSame(gout, RoundTo(out_dtype, out), "out");  // one addition at most, rounded once
    }
  }
  // Backward into fp32 gradients over 16-bit dout (the engine's default) and into dout's
  // dtype; accumulated onto the same non-zero start.
  auto dout = Rand(kN * kC, 4, -2.0f, 2.0f);
  DeviceTensor gdout(dout, act, dtype());
  for (DType grad_dtype : {DType::kF32, dtype()}) {
    SCOPED_TRACE("dwte " + std::string(DTypeName(grad_dtype)));
    auto dwte = RoundTo(grad_dtype, Random(kLocal * kC, 5));
    DeviceTensor gdwte(dwte, te, grad_dtype);
    cpu_->EmbeddingBackward(View(dout, act), View(tokens, {kB, kT}), View(dwte, te), Tensor(),
                            slice);
    gpu_->EmbeddingBackward(gdout, gtok, gdwte, Tensor(), slice);
    ExpectClose(gdwte.ToHost(), ToDouble(RoundTo(grad_dtype, dwte)),
                testing::CrossBackendTolerance(grad_dtype), "dwte");
  }
  // A slice none of whose ids occurs: nothing to add, nothing changes.
  std::vector<int32_t> low(kN, 3);
  DeviceTensor glow(low, {kB, kT});
  const auto start = Random(kLocal * kC, 6);
  DeviceTensor gdwte(start, te, DType::kF32);
  gpu_->EmbeddingBackward(gdout, glow, gdwte, Tensor(), slice);
  ExpectSame(gdwte, start, "dwte of a slice without tokens");
  // A token outside the whole table throws, as on the CPU.
  low[4] = int32_t{kVocab};
  DeviceTensor gbad(low, {kB, kT});
  DeviceTensor gout(act, DType::kF32);
  ExpectErrorMentions([&] { gpu_->EmbeddingForward(gbad, gwte, Tensor(), gout, slice); },
                      {"EmbeddingForward", "token 48", "[0, 48)"});
}

TEST_P(CudaVocabParallelTest, AddBiasAndResidualMatchesCpuBitForBit) {
  auto sum = Random(kN * kC, 1, -4.0f, 4.0f);
  const auto residual = Rand(kN * kC, 2), bias_table = Rand(kT * kC, 3), bias_row = Rand(kC, 4);
  const Shape act{kB, kT, kC};
  DeviceTensor gsum(sum, {kN, kC}, DType::kF32), gres(residual, act, dtype());
  DeviceTensor gtable(bias_table, {kT, kC}, dtype()), grow(bias_row, {kC}, dtype());
  struct Case {
    const char* name;
    std::vector<float> bias;
    Shape bias_shape;
    const DeviceTensor* gbias;
    bool residual;
  };
  const Case cases[] = {{"bias row and residual", bias_row, {kC}, &grow, true},
                        {"position table", bias_table, {kT, kC}, &gtable, false},
                        {"residual only", {}, {}, nullptr, true}};
  for (const Case& c : cases) {
    for (DType y_dtype : {dtype(), DType::kF32}) {  // fp32 y over 16-bit inputs: the adapter
      SCOPED_TRACE(std::string(c.name) + ", y " + std::string(DTypeName(y_dtype)));
      auto bias = c.bias, res = residual;
      std::vector<float> y(kN * kC);
      DeviceTensor gy(act, y_dtype);
      cpu_->AddBiasAndResidual(View(sum, {kN, kC}), c.gbias ? View(bias, c.bias_shape) : Tensor(),
                               c.residual ? View(res, act) : Tensor(), View(y, act));
      gpu_->AddBiasAndResidual(gsum, c.gbias ? static_cast<const Tensor&>(*c.gbias) : Tensor(),
                               c.residual ? static_cast<const Tensor&>(gres) : Tensor(), gy);
      ExpectSame(gy, RoundTo(y_dtype, y), "y");
    }
  }
}

// Each step from the same statistics on both sides; 23 real ids of 32, at slices of 8: the
// second slice is whole, the third holds one real id, the fourth only padding.
TEST_P(CudaVocabParallelTest, CrossEntropyStepsMatchCpu) {
  constexpr int64_t kVocab = 23, kPadded = 32, kLocal = 8;
  auto full = Rand(kN * kPadded, 1, -6.0f, 6.0f);
  auto targets = RandomInts(kN, 2, 0, int32_t{kVocab});
  targets[0] = 22;
  targets[1] = 9;
  const auto dlosses = Random(kN, 3, 0.1f, 2.0f);
  DeviceTensor gtargets(targets, {kN}), gdlosses(dlosses, {kN}, DType::kF32);
  // The group's statistics, as the all-reduces would leave them: fp32 from the same values.
  std::vector<float> group_max(kN, -std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < kN; ++i) {
    for (int64_t j = 0; j < kVocab; ++j) group_max[i] = std::max(group_max[i], full[i * kPadded + j]);
  }
  for (int64_t r = 1; r < 4; ++r) {
    SCOPED_TRACE("slice " + std::to_string(r));
    const VocabSlice slice{r * kLocal, kVocab};
    std::vector<float> logits(kN * kLocal);
    for (int64_t i = 0; i < kN; ++i) {
      std::copy_n(full.begin() + i * kPadded + r * kLocal, kLocal, logits.begin() + i * kLocal);
    }
    const Shape shape{kN, kLocal};
    DeviceTensor glogits(logits, shape, dtype());
    std::vector<float> stats(3 * kN, 0.0f), losses(kN);
    auto run = [&](CrossEntropyStep step, const std::string& what) {
      DeviceTensor gstats(stats, {3, kN}, DType::kF32), glosses({kN}, DType::kF32);
      gpu_->VocabParallelCrossEntropy(step, glogits, gtargets, slice, gstats, glosses);
      cpu_->VocabParallelCrossEntropy(step, View(logits, shape), View(targets, {kN}), slice,
                                      View(stats, {3, kN}), View(losses, {kN}));
      const std::vector<float> got = gstats.ToHost();
      for (int row = 0; row < 3; ++row) {
        const std::vector<float> g(got.begin() + row * kN, got.begin() + (row + 1) * kN);
        const std::vector<float> w(stats.begin() + row * kN, stats.begin() + (row + 1) * kN);
        if (row == 1) {
          ExpectClose(g, ToDouble(w), 1e-5, what + ": sum of exp");
        } else {
          EXPECT_EQ(g, w) << what << ": stats row " << row;  // a max and a copied logit
        }
      }
      if (step == CrossEntropyStep::kLoss) ExpectClose(glosses.ToHost(), ToDouble(losses), 1e-5, what);
    };
    run(CrossEntropyStep::kMax, "max");
    std::copy(group_max.begin(), group_max.end(), stats.begin());
    run(CrossEntropyStep::kSumExp, "sum of exp");
    for (int64_t i = 0; i < kN; ++i) {  // the other slices' sums and target logits
      stats[kN + i] += 1.5f;
      stats[2 * kN + i] += r == 1 ? 0.0f : 0.25f;
    }
    run(CrossEntropyStep::kLoss, "loss");
    auto dl = dlosses;
    DeviceTensor gstats(stats, {3, kN}, DType::kF32);
    cpu_->VocabParallelCrossEntropyBackward(View(logits, shape), View(targets, {kN}), slice,
                                            View(stats, {3, kN}), View(dl, {kN}));
    gpu_->VocabParallelCrossEntropyBackward(glogits, gtargets, slice, gstats, gdlosses);
    ExpectClose(glogits.ToHost(), ToDouble(RoundTo(dtype(), logits)), Tol(), "dlogits");
  }
  // A target outside the vocabulary throws at the first step, naming it.
  targets[5] = kVocab;
  DeviceTensor gbad(targets, {kN}), glogits(full, {kN, kPadded}, dtype());
  DeviceTensor gstats({3, kN}, DType::kF32), glosses({kN}, DType::kF32);
  ExpectErrorMentions(
      [&] {
        gpu_->VocabParallelCrossEntropy(CrossEntropyStep::kMax, glogits, gbad,
                                        VocabSlice{0, kVocab}, gstats, glosses);
      },
      {"VocabParallelCrossEntropy", "target 23", "row 5"});
}

}  // namespace
}  // namespace ztrain::kernels
