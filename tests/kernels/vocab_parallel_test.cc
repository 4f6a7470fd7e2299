// The op set's tensor-parallel pieces on the CPU (kernels/ops.h): the vocabulary slices of
// EmbeddingForward/Backward, AddBiasAndResidual and the vocabulary-parallel cross-entropy.
// Each is checked against the whole op: P slices' results, combined here as a tp group
// combines them (a sum, a max, a concatenation), must give what one process computes. The
// embedding's pieces are exact (one slice contributes each row, the others +0, and the
// gradients add in the same order), so they are compared bit for bit; the cross-entropy
// splits its sums of exp by slice, so its losses and dlogits are compared within a few fp32
// roundings. The layers built on them are tested against the single process under mpirun
// (tests/parallel/tensor), and the CUDA versions against these (cuda_vocab_parallel_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "half_test_util.h"
#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace ztrain::kernels {
namespace {

using testing::ExpectClose;
using testing::ExpectErrorMentions;
using testing::HostTensor;
using testing::Random;
using testing::RandomInts;
using testing::ToDouble;
using testing::View;

constexpr int64_t kB = 2, kT = 5, kC = 12, kN = kB * kT;
constexpr int64_t kPaddedVocab = 24;  // divisible by every slice count below

// Tokens of every slice, the first and last ids among them.
std::vector<int32_t> Tokens() {
  auto t = RandomInts(kN, 11, 0, int32_t{kPaddedVocab});
  t[0] = 0;
  t[1] = int32_t{kPaddedVocab} - 1;
  t[2] = t[3];  // a repeated token: its gradient rows add up
  return t;
}

// Rows [begin, begin + rows) of a row-major [*, cols] host vector, as a view.
Tensor Rows(std::vector<float>& v, int64_t begin, int64_t rows, int64_t cols) {
  return Tensor(v.data() + begin * cols, DType::kF32, {rows, cols});
}

TEST(VocabSliceTest, EmbeddingSlicesSumToTheWholeLookup) {
  auto ops = MakeCpuOps();
  auto tokens = Tokens();
  auto wte = Random(kPaddedVocab * kC, 1), wpe = Random(kT * kC, 2);
  const Shape act{kB, kT, kC};
  std::vector<float> whole(kN * kC), whole_pe(kN * kC);
  ops->EmbeddingForward(View(tokens, {kB, kT}), View(wte, {kPaddedVocab, kC}), Tensor(),
                        View(whole, act));
  ops->EmbeddingForward(View(tokens, {kB, kT}), View(wte, {kPaddedVocab, kC}),
                        View(wpe, {kT, kC}), View(whole_pe, act));
  for (int64_t slices : {1, 2, 3, 4}) {
    SCOPED_TRACE(std::to_string(slices) + " slices");
    const int64_t local = kPaddedVocab / slices;
    std::vector<float> sum(kN * kC, 0.0f);
    for (int64_t r = 0; r < slices; ++r) {
      const VocabSlice slice{r * local, kPaddedVocab};
      std::vector<float> part(kN * kC, std::nanf("")), part_pe(kN * kC, std::nanf(""));
      ops->EmbeddingForward(View(tokens, {kB, kT}), Rows(wte, r * local, local, kC), Tensor(),
                            View(part, act), slice);
      ops->EmbeddingForward(View(tokens, {kB, kT}), Rows(wte, r * local, local, kC),
                            View(wpe, {kT, kC}), View(part_pe, act), slice);
      for (int64_t i = 0; i < kN; ++i) {
        const bool mine = tokens[i] >= slice.begin && tokens[i] < slice.begin + local;
        for (int64_t c = 0; c < kC; ++c) {
          const size_t k = static_cast<size_t>(i * kC + c);
          // A token of the slice reads its row; another reads zeros (+ its position's row).
          ASSERT_EQ(part[k], mine ? whole[k] : 0.0f) << "row " << i << " slice " << r;
          ASSERT_EQ(part_pe[k], mine ? whole_pe[k] : wpe[(i % kT) * kC + c]) << "row " << i;
          sum[k] += part[k];
        }
      }
    }
    EXPECT_EQ(sum, whole);
  }
}

// The slices' gradients, side by side, are the whole table's: the same additions in the same
// order (bit for bit), also with 16-bit dout into fp32 gradients (the engine's mixed case).
TEST(VocabSliceTest, EmbeddingSliceGradientsAreTheWholeGradientsRows) {
  auto ops = MakeCpuOps();
  auto tokens = Tokens();
  for (DType dout_dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dout_dtype));
    const HostTensor dout =
        HostTensor::From(dout_dtype, {kB, kT, kC}, Random(kN * kC, 3, -2.0f, 2.0f));
    const auto start = Random(kPaddedVocab * kC, 4);
    auto whole = start;
    ops->EmbeddingBackward(dout.tensor(), View(tokens, {kB, kT}), View(whole, {kPaddedVocab, kC}),
                           Tensor());
    ASSERT_NE(whole, start);
    for (int64_t slices : {2, 3, 4}) {
      SCOPED_TRACE(std::to_string(slices) + " slices");
      const int64_t local = kPaddedVocab / slices;
      auto joined = start;
      for (int64_t r = 0; r < slices; ++r) {
        ops->EmbeddingBackward(dout.tensor(), View(tokens, {kB, kT}),
                               Rows(joined, r * local, local, kC), Tensor(),
                               VocabSlice{r * local, kPaddedVocab});
      }
      EXPECT_EQ(joined, whole);
    }
  }
}

TEST(VocabSliceTest, TokensOutsideTheVocabularyAndBadSlicesThrow) {
  auto ops = MakeCpuOps();
  auto tokens = Tokens();
  tokens[7] = int32_t{kPaddedVocab};  // in no slice: outside the whole table
  auto wte = Random(8 * kC, 1);
  std::vector<float> out(kN * kC), dwte(8 * kC, 0.0f);
  const Shape act{kB, kT, kC};
  ExpectErrorMentions(
      [&] {
        ops->EmbeddingForward(View(tokens, {kB, kT}), View(wte, {8, kC}), Tensor(),
                              View(out, act), VocabSlice{16, kPaddedVocab});
      },
      {"EmbeddingForward", "token 24", "[b=1, t=2]", "[0, 24)"});
  ExpectErrorMentions(
      [&] {
        ops->EmbeddingBackward(View(out, act), View(tokens, {kB, kT}), View(dwte, {8, kC}),
                               Tensor(), VocabSlice{0, kPaddedVocab});
      },
      {"EmbeddingBackward", "token 24"});
  EXPECT_EQ(dwte, std::vector<float>(8 * kC, 0.0f)) << "nothing written before the throw";
  tokens[7] = 0;
  ExpectErrorMentions(
      [&] {
        ops->EmbeddingForward(View(tokens, {kB, kT}), View(wte, {8, kC}), Tensor(),
                              View(out, act), VocabSlice{20, kPaddedVocab});
      },
      {"EmbeddingForward", "wte holds ids [20, 28)", "[0, 24)"});
}

// y = sum + (bias + residual) in fp32, rounded once into y's dtype: bit for bit against that
// computation here, for a bias of one row, a table of T rows repeated over the batch, and
// either left out.
TEST(AddBiasAndResidualTest, RoundsTheFp32SumOnce) {
  auto ops = MakeCpuOps();
  auto sum = Random(kN * kC, 1, -4.0f, 4.0f);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t bias_rows : {int64_t{0}, int64_t{1}, kT}) {
      for (bool with_residual : {false, true}) {
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " bias rows " + std::to_string(bias_rows) +
                     (with_residual ? " with residual" : ""));
        const HostTensor bias =
            HostTensor::From(dtype, {std::max<int64_t>(bias_rows, 1), kC},
                             Random(std::max<int64_t>(bias_rows, 1) * kC, 2));
        const HostTensor residual = HostTensor::From(dtype, {kB, kT, kC}, Random(kN * kC, 3));
        HostTensor y(dtype, {kB, kT, kC});
        ops->AddBiasAndResidual(View(sum, {kN, kC}), bias_rows > 0 ? bias.tensor() : Tensor(),
                                with_residual ? residual.tensor() : Tensor(), y.tensor());
        HostTensor want(dtype, {kB, kT, kC});
        for (int64_t i = 0; i < kN; ++i) {
          for (int64_t c = 0; c < kC; ++c) {
            const size_t k = static_cast<size_t>(i * kC + c);
            const float b = bias_rows > 0 ? bias.Get((i % bias_rows) * kC + c) : 0.0f;
            const float r = with_residual ? residual.Get(k) : 0.0f;
            want.Set(k, sum[k] + (b + r));
          }
        }
        EXPECT_TRUE(y.SameBytes(want));
      }
    }
  }
  std::vector<float> y(kN * kC);
  auto bias = Random(3 * kC, 2);
  ExpectErrorMentions(
      [&] {
        ops->AddBiasAndResidual(View(sum, {kN, kC}), View(bias, {3, kC}), Tensor(),
                                View(y, {kN, kC}));
      },
      {"AddBiasAndResidual", "bias", "3 rows", "10 rows"});
}

// The vocabulary-parallel cross-entropy of P slices, combined as MegatronLinears combines
// them (a max, then a sum of the other two statistics), against the whole fused op.
struct CeRun {
  std::vector<float> losses;               // every rank's, which must agree
  std::vector<std::vector<float>> dlogits;  // per rank: [N, local]
};

CeRun RunSlices(Ops& ops, const HostTensor& logits, const std::vector<int32_t>& targets,
                int64_t vocab, int64_t slices, const std::vector<float>& dlosses) {
  const int64_t n = logits.shape()[0], vp = logits.shape()[1], local = vp / slices;
  std::vector<HostTensor> parts;
  std::vector<std::vector<float>> stats(slices, std::vector<float>(3 * n));
  for (int64_t r = 0; r < slices; ++r) {
    HostTensor p(logits.dtype(), {n, local});
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < local; ++j) p.Set(i * local + j, logits.Get(i * vp + r * local + j));
    }
    parts.push_back(std::move(p));
  }
  auto tgt = targets;
  std::vector<float> losses(n);
  auto step = [&](CrossEntropyStep s) {
    for (int64_t r = 0; r < slices; ++r) {
      ops.VocabParallelCrossEntropy(s, parts[r].tensor(), View(tgt, {n}),
                                    VocabSlice{r * local, vocab}, View(stats[r], {3, n}),
                                    View(losses, {n}));
    }
  };
  // The all-reduces: kMax over row 0, then kSum over rows 1 and 2.
  auto reduce = [&](int64_t first_row, int64_t rows, bool max) {
    for (int64_t k = first_row * n; k < (first_row + rows) * n; ++k) {
      float acc = max ? -std::numeric_limits<float>::infinity() : 0.0f;
      for (int64_t r = 0; r < slices; ++r) acc = max ? std::max(acc, stats[r][k]) : acc + stats[r][k];
      for (int64_t r = 0; r < slices; ++r) stats[r][k] = acc;
    }
  };
  step(CrossEntropyStep::kMax);
  reduce(0, 1, true);
  step(CrossEntropyStep::kSumExp);
  reduce(1, 2, false);
  CeRun run;
  for (int64_t r = 0; r < slices; ++r) {
    ops.VocabParallelCrossEntropy(CrossEntropyStep::kLoss, parts[r].tensor(), View(tgt, {n}),
                                  VocabSlice{r * local, vocab}, View(stats[r], {3, n}),
                                  View(losses, {n}));
    if (r == 0) run.losses = losses;
    EXPECT_EQ(losses, run.losses) << "rank " << r << " computed other losses";
    auto dl = dlosses;
    ops.VocabParallelCrossEntropyBackward(parts[r].tensor(), View(tgt, {n}),
                                          VocabSlice{r * local, vocab}, View(stats[r], {3, n}),
                                          View(dl, {n}));
    run.dlogits.push_back(parts[r].Values());
  }
  return run;
}

// 23 real ids of 32 padded: at 4 slices the third holds one real id and the fourth none.
TEST(VocabParallelCrossEntropyTest, SlicesCombineToTheWholeLoss) {
  auto ops = MakeCpuOps();
  constexpr int64_t kVocab = 23, kPadded = 32;
  auto targets = RandomInts(kN, 5, 0, int32_t{kVocab});
  targets[0] = kVocab - 1;  // the real id of the third slice at 4 slices
  targets[3] = kIgnoreTarget;  // no loss, no gradient, in the whole op and in every slice
  const auto dlosses = Random(kN, 6, 0.1f, 2.0f);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto values = Random(kN * kPadded, 7, -6.0f, 6.0f);
    for (int64_t i = 0; i < kN; ++i) {  // padding is never read: NaN must not leak
      for (int64_t j = kVocab; j < kPadded; ++j) values[i * kPadded + j] = std::nanf("");
    }
    const HostTensor logits = HostTensor::From(dtype, {kN, kPadded}, values);
    HostTensor whole_logits = logits;
    auto tgt = targets;
    auto dl = dlosses;
    std::vector<float> whole_losses(kN);
    ops->SoftmaxCrossEntropy(whole_logits.tensor(), View(tgt, {kN}), kVocab,
                             View(whole_losses, {kN}), View(dl, {kN}));
    const std::vector<float> whole_dlogits = whole_logits.Values();
    EXPECT_EQ(whole_losses[3], 0.0f);
    for (int64_t j = 0; j < kPadded; ++j) ASSERT_EQ(whole_dlogits[3 * kPadded + j], 0.0f);
    // fp32: sums of exp split four ways, a few roundings; bf16: each dlogit rounded once.
    const double tol = dtype == DType::kF32 ? 1e-5 : 1e-2;
    for (int64_t slices : {1, 2, 4}) {
      SCOPED_TRACE(std::to_string(slices) + " slices");
      const CeRun run = RunSlices(*ops, logits, targets, kVocab, slices, dlosses);
      ExpectClose(run.losses, ToDouble(whole_losses), 1e-5, "losses");
      const int64_t local = kPadded / slices;
      std::vector<float> joined(kN * kPadded);
      for (int64_t r = 0; r < slices; ++r) {
        for (int64_t i = 0; i < kN; ++i) {
          std::copy_n(run.dlogits[r].begin() + i * local, local,
                      joined.begin() + i * kPadded + r * local);
        }
      }
      ExpectClose(joined, ToDouble(whole_dlogits), tol, "dlogits");
      for (int64_t i = 0; i < kN; ++i) {  // the padding's gradient is exactly 0
        for (int64_t j = kVocab; j < kPadded; ++j) ASSERT_EQ(joined[i * kPadded + j], 0.0f);
      }
    }
  }
}

TEST(VocabParallelCrossEntropyTest, ABadTargetThrowsBeforeAnythingIsWritten) {
  auto ops = MakeCpuOps();
  auto logits = Random(kN * 8, 1);
  auto targets = RandomInts(kN, 2, 0, 20);
  targets[4] = 20;
  std::vector<float> stats(3 * kN, 7.0f), losses(kN);
  ExpectErrorMentions(
      [&] {
        ops->VocabParallelCrossEntropy(CrossEntropyStep::kMax, View(logits, {kN, 8}),
                                       View(targets, {kN}), VocabSlice{8, 20},
                                       View(stats, {3, kN}), View(losses, {kN}));
      },
      {"VocabParallelCrossEntropy", "target 20", "row 4", "[0, 20)"});
  EXPECT_EQ(stats, std::vector<float>(3 * kN, 7.0f));
}

}  // namespace
}  // namespace ztrain::kernels
