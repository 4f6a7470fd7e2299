// Token + position embedding: exact forward, exact (deterministic) backward, token checks;
// and the token embedding alone (no position table, an undefined wpe / dwpe).
#include <vector>

#include "frozen_test_util.h"
#include "kernel_test_util.h"

namespace ztrain::kernels {
namespace {

using testing::ExpectClose;
using testing::ExpectErrorMentions;
using testing::Random;
using testing::RandomInts;
using testing::View;

TEST(EmbeddingTest, ForwardAddsTokenAndPositionRows) {
  auto ops = MakeCpuOps();
  const int64_t batch = 3, seq = 5, ch = 37, vocab = 11, max_t = 8;
  auto tokens = RandomInts(batch * seq, 1, 0, vocab);
  auto wte = Random(vocab * ch, 2), wpe = Random(max_t * ch, 3);
  std::vector<float> out(batch * seq * ch);
  ops->EmbeddingForward(View(tokens, {batch, seq}), View(wte, {vocab, ch}),
                        View(wpe, {max_t, ch}), View(out, {batch, seq, ch}));
  for (int64_t i = 0; i < batch * seq; ++i) {
    for (int64_t c = 0; c < ch; ++c) {
      ASSERT_EQ(out[i * ch + c], wte[tokens[i] * ch + c] + wpe[(i % seq) * ch + c]) << i;
    }
  }
}

TEST(EmbeddingTest, BackwardAccumulatesRepeatedTokens) {
  auto ops = MakeCpuOps();
  const int64_t batch = 4, seq = 33, ch = 70, vocab = 5, max_t = 40;  // many repeats
  auto tokens = RandomInts(batch * seq, 4, 0, vocab);
  auto dout = Random(batch * seq * ch, 5);
  auto dwte = Random(vocab * ch, 6), dwpe = Random(max_t * ch, 7);  // accumulated into
  std::vector<double> want_te(dwte.begin(), dwte.end()), want_pe(dwpe.begin(), dwpe.end());
  for (int64_t i = 0; i < batch * seq; ++i) {
    for (int64_t c = 0; c < ch; ++c) {
      want_te[tokens[i] * ch + c] += dout[i * ch + c];
      want_pe[(i % seq) * ch + c] += dout[i * ch + c];
    }
  }
  ops->EmbeddingBackward(View(dout, {batch, seq, ch}), View(tokens, {batch, seq}),
                         View(dwte, {vocab, ch}), View(dwpe, {max_t, ch}));
  ExpectClose(dwte, want_te, 1e-6, "dwte");
  ExpectClose(dwpe, want_pe, 1e-6, "dwpe");
  for (int64_t c = 0; c < ch; ++c) {
    EXPECT_EQ(dwpe[(max_t - 1) * ch + c], float(want_pe[(max_t - 1) * ch + c]))
        << "positions past T are untouched";
  }
}

TEST(EmbeddingTest, WithoutPositionTableCopiesTokenRowsAndSumsTheirGradients) {
  auto ops = MakeCpuOps();
  const int64_t batch = 3, seq = 40, ch = 70, vocab = 6;  // many repeats, several threads
  auto tokens = RandomInts(batch * seq, 8, 0, vocab);
  auto wte = Random(vocab * ch, 9), dout = Random(batch * seq * ch, 10);
  std::vector<float> out(batch * seq * ch, 5.0f);
  ops->EmbeddingForward(View(tokens, {batch, seq}), View(wte, {vocab, ch}), Tensor(),
                        View(out, {batch, seq, ch}));
  for (int64_t i = 0; i < batch * seq; ++i) {
    for (int64_t c = 0; c < ch; ++c) ASSERT_EQ(out[i * ch + c], wte[tokens[i] * ch + c]) << i;
  }
  auto dwte = Random(vocab * ch, 11);  // accumulated into
  std::vector<double> want(dwte.begin(), dwte.end());
  for (int64_t i = 0; i < batch * seq; ++i) {
    for (int64_t c = 0; c < ch; ++c) want[tokens[i] * ch + c] += dout[i * ch + c];
  }
  ops->EmbeddingBackward(View(dout, {batch, seq, ch}), View(tokens, {batch, seq}),
                         View(dwte, {vocab, ch}), Tensor());
  ExpectClose(dwte, want, 1e-6, "dwte");
}

// Note [Frozen parameters]: dwte, dwpe or both undefined; the other table's gradient comes out
// bit for bit (in parallel: B * T * C is past the one-thread grain).
TEST(EmbeddingTest, BackwardSkipsFrozenTables) {
  using testing::ArgSpec;
  using testing::Role;
  auto ops = MakeCpuOps();
  const int64_t batch = 4, seq = 64, ch = 130, vocab = 9, max_t = 70;
  std::vector<ArgSpec> specs = {{"dout", Role::kAct, {batch, seq, ch}},
                                {"tokens", Role::kIndex, {batch, seq}, int32_t(vocab)},
                                {"dwte", Role::kGrad, {vocab, ch}},
                                {"dwpe", Role::kGrad, {max_t, ch}}};
  testing::ExpectFrozenGradsSkippedEverywhere(
      *ops, specs, {{"dwte"}, {"dwpe"}, {"dwte", "dwpe"}},
      [](Ops& o, const auto& v) { o.EmbeddingBackward(v[0], v[1], v[2], v[3]); });
  specs.pop_back();  // no position table, and a frozen token table: nothing to do
  testing::ExpectFrozenGradsSkippedEverywhere(*ops, specs, {{"dwte"}}, [](Ops& o, const auto& v) {
    o.EmbeddingBackward(v[0], v[1], v[2], Tensor());
  });
}

TEST(EmbeddingTest, BackwardWithAFrozenTokenTableChecksShapes) {
  auto ops = MakeCpuOps();
  std::vector<int32_t> tokens(6, 0);
  std::vector<float> dout(6 * 4), dwpe(3 * 4);
  ExpectErrorMentions(
      [&] {
        ops->EmbeddingBackward(View(dout, {2, 4, 3}), View(tokens, {2, 3}), Tensor(),
                               View(dwpe, {3, 4}));
      },
      {"EmbeddingBackward", "dout", "[2, 4, 3]", "[2, 3, C]"});
  ExpectErrorMentions(
      [&] {
        ops->EmbeddingBackward(View(dout, {2, 3, 4}), View(tokens, {2, 3}), Tensor(),
                               View(dwpe, {4, 3}));
      },
      {"EmbeddingBackward", "dwpe", "[4, 3]"});
}

TEST(EmbeddingTest, RejectsOutOfRangeTokensNamingThem) {
  auto ops = MakeCpuOps();
  std::vector<int32_t> tokens = {0, 1, 2, 3, 4, 9};
  std::vector<float> wte(9 * 4), wpe(3 * 4), out(6 * 4, 5.0f);
  ExpectErrorMentions(
      [&] {
        ops->EmbeddingForward(View(tokens, {2, 3}), View(wte, {9, 4}), View(wpe, {3, 4}),
                              View(out, {2, 3, 4}));
      },
      {"EmbeddingForward", "token 9", "b=1, t=2", "[0, 9)"});
  EXPECT_EQ(out, std::vector<float>(6 * 4, 5.0f)) << "nothing is written before the check";
  tokens[5] = -1;
  ExpectErrorMentions(
      [&] {
        ops->EmbeddingBackward(View(out, {2, 3, 4}), View(tokens, {2, 3}), View(wte, {9, 4}),
                               View(wpe, {3, 4}));
      },
      {"EmbeddingBackward", "token -1"});
}

TEST(EmbeddingTest, RejectsWrongShapes) {
  auto ops = MakeCpuOps();
  std::vector<int32_t> tokens(6, 0);
  std::vector<float> wte(9 * 4), wpe(3 * 4), out(6 * 4);
  ExpectErrorMentions(
      [&] {
        ops->EmbeddingForward(View(tokens, {3, 2}), View(wte, {9, 4}), View(wpe, {1, 12}),
                              View(out, {3, 2, 4}));
      },
      {"EmbeddingForward", "wpe"});
  ExpectErrorMentions(
      [&] {
        ops->EmbeddingBackward(View(out, {2, 3, 4}), View(tokens, {2, 3}), View(wte, {9, 4}),
                               View(wpe, {1, 12}));
      },
      {"EmbeddingBackward", "dwpe", "[1, 12]"});
  ExpectErrorMentions(
      [&] {
        ops->EmbeddingForward(View(tokens, {2, 3}), View(wte, {9, 4}), View(wpe, {3, 4}),
                              View(out, {2, 4, 3}));
      },
      {"EmbeddingForward", "out"});
  std::vector<float> float_tokens(6);
  ExpectErrorMentions(
      [&] {
        ops->EmbeddingForward(View(float_tokens, {2, 3}), View(wte, {9, 4}), View(wpe, {3, 4}),
                              View(out, {2, 3, 4}));
      },
      {"EmbeddingForward", "tokens", "int32"});
}

}  // namespace
}  // namespace ztrain::kernels
