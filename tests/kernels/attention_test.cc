// Causal attention (multi-head, grouped-query, multi-query) against a naive double reference
// that materialises the full T x T matrix, and its backward against an analytic double
// reference and finite differences; grouped-query attention against multi-head attention on
// the KV heads repeated, bit for bit.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "kernel_test_util.h"

namespace ztrain::kernels {
namespace {

using testing::ExpectClose;
using testing::ExpectErrorMentions;
using testing::Random;
using testing::View;

// One attention shape: NH query heads, NKV key/value heads of HS features (ops.h's layout),
// and the keys each query sees beyond causality (ops.h's AttentionMask): a sliding window of
// `window` keys, and packed documents, `doc_lengths` laid end to end in each batch row; with an
// `offset`, query row i sits at key index i + offset (ring attention's blocks).
struct AttnCase {
  int64_t batch, seq;
  int heads, kv_heads, head_dim;
  int64_t window = 0;
  std::vector<int64_t> doc_lengths = {};
  int64_t offset = 0;
  AttentionHeads Heads() const { return {heads, kv_heads, head_dim}; }
  // positions [B, T]: each row counts 0, 1, ... within each document (empty: no documents).
  std::vector<int32_t> Positions() const {
    if (doc_lengths.empty()) return {};
    std::vector<int32_t> pos;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t len : doc_lengths) {
        for (int64_t t = 0; t < len; ++t) pos.push_back(static_cast<int32_t>(t));
      }
    }
    EXPECT_EQ(static_cast<int64_t>(pos.size()), batch * seq) << "doc_lengths must sum to T";
    return pos;
  }
  // Whether query i sees key j, from the definitions (Hugging Face's masks), not the kernel's.
  // Query i is the sequence's token i + offset.
  bool Visible(int64_t i, int64_t j) const {
    const int64_t at = i + offset;
    if (j > at) return false;                            // causal_mask_function
    if (window > 0 && !(j > at - window)) return false;  // sliding_window_overlay
    if (doc_lengths.empty()) return true;
    int64_t start = 0;  // the document holding i, as many tokens back from `at` as from i
    for (int64_t len : doc_lengths) {
      if (i < start + len) break;
      start += len;
    }
    return j >= start + offset;
  }
  int64_t width() const { return Heads().qkv_width(); }    // qkv row
  int64_t out_width() const { return Heads().q_width(); }  // out row
  // Columns of query head h's q, and of the k and v of the KV head it reads.
  int64_t QCol(int64_t h) const { return h * head_dim; }
  int64_t KCol(int64_t h) const { return (heads + h / (heads / kv_heads)) * head_dim; }
  int64_t VCol(int64_t h) const { return KCol(h) + int64_t{kv_heads} * head_dim; }
  std::string Name() const {
    std::string name = "B=" + std::to_string(batch) + " T=" + std::to_string(seq) +
                       " NH=" + std::to_string(heads) + " NKV=" + std::to_string(kv_heads) +
                       " HS=" + std::to_string(head_dim);
    if (window > 0) name.append(" window=").append(std::to_string(window));
    if (!doc_lengths.empty()) name.append(" documents=").append(std::to_string(doc_lengths.size()));
    if (offset != 0) name.append(" offset=").append(std::to_string(offset));
    return name;
  }
};

// GPT-2's form: qkv [B,T,3C], NH heads of C / NH.
AttnCase MultiHead(int64_t batch, int64_t seq, int64_t ch, int heads) {
  return {batch, seq, heads, heads, static_cast<int>(ch / heads)};
}

// Softmax probabilities P[i][j] (0 where query i does not see key j) of one (b, query head h)
// in double, row-major T x T.
std::vector<double> RefProbs(const std::vector<double>& qkv, const AttnCase& tc, int64_t b,
                             int64_t h, std::vector<double>* lse) {
  const int64_t hs = tc.head_dim, stride = tc.width(), T = tc.seq;
  const double* q = qkv.data() + b * T * stride + tc.QCol(h);
  const double* k = qkv.data() + b * T * stride + tc.KCol(h);
  std::vector<double> p(T * T, 0.0);
  for (int64_t i = 0; i < T; ++i) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < T; ++j) {
      if (!tc.Visible(i, j)) continue;
      double s = 0.0;
      for (int64_t d = 0; d < hs; ++d) s += q[i * stride + d] * k[j * stride + d];
      p[i * T + j] = s / std::sqrt(double(hs));
      mx = std::max(mx, p[i * T + j]);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < T; ++j) sum += tc.Visible(i, j) ? std::exp(p[i * T + j] - mx) : 0.0;
    for (int64_t j = 0; j < T; ++j) {
      p[i * T + j] = tc.Visible(i, j) ? std::exp(p[i * T + j] - mx) / sum : 0.0;
    }
    if (lse) (*lse)[(b * tc.heads + h) * T + i] = mx + std::log(sum);
  }
  return p;
}

std::vector<double> RefForward(const std::vector<double>& qkv, const AttnCase& tc,
                               std::vector<double>* lse) {
  const int64_t hs = tc.head_dim, stride = tc.width(), T = tc.seq, ow = tc.out_width();
  std::vector<double> out(tc.batch * T * ow, 0.0);
  for (int64_t b = 0; b < tc.batch; ++b) {
    for (int64_t h = 0; h < tc.heads; ++h) {
      const std::vector<double> p = RefProbs(qkv, tc, b, h, lse);
      const double* v = qkv.data() + b * T * stride + tc.VCol(h);
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = 0; j < T; ++j) {
          for (int64_t d = 0; d < hs; ++d) {
            out[(b * T + i) * ow + h * hs + d] += p[i * T + j] * v[j * stride + d];
          }
        }
      }
    }
  }
  return out;
}

// dqkv from dout by the textbook formulas on the full P matrix; a KV head's gradient sums
// over the query heads that read it.
std::vector<double> RefBackward(const std::vector<double>& qkv, const std::vector<float>& dout,
                                const AttnCase& tc) {
  const int64_t hs = tc.head_dim, stride = tc.width(), T = tc.seq, ow = tc.out_width();
  const double scale = 1.0 / std::sqrt(double(hs));
  std::vector<double> dqkv(qkv.size(), 0.0);
  for (int64_t b = 0; b < tc.batch; ++b) {
    for (int64_t h = 0; h < tc.heads; ++h) {
      const std::vector<double> p = RefProbs(qkv, tc, b, h, nullptr);
      const int64_t base = b * T * stride;
      const int64_t qc = tc.QCol(h), kc = tc.KCol(h), vc = tc.VCol(h);
      auto q = [&](int64_t t, int64_t d) { return qkv[base + t * stride + qc + d]; };
      auto k = [&](int64_t t, int64_t d) { return qkv[base + t * stride + kc + d]; };
      auto v = [&](int64_t t, int64_t d) { return qkv[base + t * stride + vc + d]; };
      auto g = [&](int64_t t, int64_t d) { return double{dout[(b * T + t) * ow + h * hs + d]}; };
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> dp(T);
        double row = 0.0;
        for (int64_t j = 0; j < T; ++j) {
          for (int64_t d = 0; d < hs; ++d) dp[j] += g(i, d) * v(j, d);
          row += p[i * T + j] * dp[j];
        }
        for (int64_t j = 0; j < T; ++j) {
          const double ds = p[i * T + j] * (dp[j] - row) * scale;
          for (int64_t d = 0; d < hs; ++d) {
            dqkv[base + i * stride + qc + d] += ds * k(j, d);
            dqkv[base + j * stride + kc + d] += ds * q(i, d);
            dqkv[base + j * stride + vc + d] += p[i * T + j] * g(i, d);
          }
        }
      }
    }
  }
  return dqkv;
}

// Runs the forward (and, with dout, the backward) through the AttentionHeads form, or through
// GPT-2's int form when `int_form`.
struct AttnRun {
  std::vector<float> out, lse, dqkv;
};
AttnRun RunAttention(Ops& ops, const AttnCase& tc, std::vector<float>& qkv,
                     std::vector<float>* dout, bool int_form = false) {
  AttnRun r{std::vector<float>(tc.batch * tc.seq * tc.out_width()),
            std::vector<float>(tc.batch * tc.heads * tc.seq),
            std::vector<float>(qkv.size(), 77.0f)};  // dqkv must be overwritten
  const Tensor qkv_t = View(qkv, {tc.batch, tc.seq, tc.width()});
  const Tensor out_t = View(r.out, {tc.batch, tc.seq, tc.out_width()});
  const Tensor lse_t = View(r.lse, {tc.batch, tc.heads, tc.seq});
  std::vector<int32_t> positions = tc.Positions();
  AttentionMask mask{tc.window, {}, tc.offset};
  if (!positions.empty()) {
    mask.positions = Tensor(positions.data(), DType::kI32, {tc.batch, tc.seq});
  }
  const bool masked = !mask.causal_only();
  EXPECT_FALSE(masked && int_form) << "GPT-2's int form has no mask";
  // heads: an int (GPT-2's form) or AttentionHeads.
  auto forward = [&](auto heads) { ops.AttentionForward(qkv_t, heads, out_t, lse_t); };
  if (masked) {
    ops.AttentionForward(qkv_t, tc.Heads(), mask, out_t, lse_t);
  } else {
    int_form ? forward(tc.heads) : forward(tc.Heads());
  }
  if (dout == nullptr) return r;
  const Tensor dout_t = View(*dout, {tc.batch, tc.seq, tc.out_width()});
  const Tensor dqkv_t = View(r.dqkv, {tc.batch, tc.seq, tc.width()});
  auto backward = [&](auto heads) {
    ops.AttentionBackward(dout_t, qkv_t, out_t, lse_t, heads, dqkv_t);
  };
  if (masked) {
    ops.AttentionBackward(dout_t, qkv_t, out_t, lse_t, tc.Heads(), mask, dqkv_t);
  } else {
    int_form ? backward(tc.heads) : backward(tc.Heads());
  }
  return r;
}

// GPT-2's form. Awkward T around the blocks (Note [Attention tiles]: the forward's 64-row query
// blocks and 256-key blocks, the backward's 64 by 128) and head sizes 4..128, so that every
// register block of the products runs (64, 48, 32 and 16 columns, 1 to 6 rows) and the
// columns past the last multiple of 16 take the plain loop.
const AttnCase kMultiHeadCases[] = {MultiHead(1, 1, 8, 1),     MultiHead(2, 7, 12, 3),
                                    MultiHead(1, 64, 32, 2),   MultiHead(1, 65, 16, 4),
                                    MultiHead(1, 67, 16, 2),   MultiHead(2, 130, 24, 3),
                                    MultiHead(1, 130, 128, 2), MultiHead(1, 70, 128, 1),
                                    MultiHead(1, 257, 96, 2),  MultiHead(1, 530, 40, 2)};

// Grouped-query (groups of 2, 3, 4) and multi-query heads, head_dim chosen apart from any
// model width (NH * HS is no C of the case), across block boundaries (one key block of the
// forward and several, the last one short) and every register block.
const AttnCase kGroupedCases[] = {{1, 67, 4, 2, 16},  {2, 7, 6, 2, 4},    {1, 130, 8, 2, 64},
                                  {2, 65, 3, 1, 12},  {1, 70, 4, 1, 128}, {1, 33, 2, 2, 24},
                                  {1, 300, 4, 2, 20}, {1, 600, 3, 1, 64}};

// Every case with the form it is called through (GPT-2's int form for the multi-head ones).
std::vector<std::pair<AttnCase, bool>> AllCases() {
  std::vector<std::pair<AttnCase, bool>> all;
  for (const AttnCase& tc : kMultiHeadCases) all.emplace_back(tc, true);
  for (const AttnCase& tc : kGroupedCases) all.emplace_back(tc, false);
  return all;
}

TEST(AttentionTest, ForwardMatchesNaiveReference) {
  auto ops = MakeCpuOps();
  for (const auto& [tc, int_form] : AllCases()) {
    SCOPED_TRACE(tc.Name());
    auto qkv = Random(tc.batch * tc.seq * tc.width(), 1);
    const AttnRun r = RunAttention(*ops, tc, qkv, nullptr, int_form);
    std::vector<double> ref_lse(r.lse.size());
    ExpectClose(r.out, RefForward(testing::ToDouble(qkv), tc, &ref_lse), 1e-5, "out");
    // A row that sees no key (an offset past a window) has lse -infinity on both sides, and
    // the rest are compared.
    std::vector<float> lse = r.lse;
    for (size_t i = 0; i < lse.size(); ++i) {
      ASSERT_EQ(std::isinf(lse[i]), std::isinf(ref_lse[i])) << "lse " << i;
      if (std::isinf(ref_lse[i])) lse[i] = 0.0f, ref_lse[i] = 0.0;
    }
    ExpectClose(lse, ref_lse, 1e-5, "lse");
  }
}

TEST(AttentionTest, ForwardIsStableForLargeScores) {
  auto ops = MakeCpuOps();
  for (const AttnCase& tc : {MultiHead(1, 70, 16, 2), AttnCase{1, 70, 4, 1, 8}}) {
    SCOPED_TRACE(tc.Name());
    // Scores up to ~400: fp32 rounding of a score moves its probability by ~|score| * 6e-8,
    // so this ill-conditioned case gets a looser tolerance; what it checks is no overflow.
    auto qkv = Random(tc.seq * tc.width(), 2, -12.0f, 12.0f);
    const AttnRun r = RunAttention(*ops, tc, qkv, nullptr);
    std::vector<double> ref_lse(r.lse.size());
    ExpectClose(r.out, RefForward(testing::ToDouble(qkv), tc, &ref_lse), 1e-4, "out");
    ExpectClose(r.lse, ref_lse, 1e-5, "lse");
  }
}

TEST(AttentionTest, BackwardMatchesAnalyticReference) {
  auto ops = MakeCpuOps();
  for (const auto& [tc, int_form] : AllCases()) {
    SCOPED_TRACE(tc.Name());
    auto qkv = Random(tc.batch * tc.seq * tc.width(), 3);
    auto dout = Random(tc.batch * tc.seq * tc.out_width(), 4);
    const AttnRun r = RunAttention(*ops, tc, qkv, &dout, int_form);
    ExpectClose(r.dqkv, RefBackward(testing::ToDouble(qkv), dout, tc), 1e-5, "dqkv");
  }
}

TEST(AttentionTest, BackwardMatchesFiniteDifferences) {
  auto ops = MakeCpuOps();
  // The small cases are checked at every element, the ones spanning several blocks at a
  // sample; the last two under masks (a window inside documents).
  for (const AttnCase& tc :
       {MultiHead(2, 7, 12, 3), MultiHead(1, 67, 16, 2), AttnCase{2, 7, 6, 2, 4},
        AttnCase{1, 67, 3, 1, 8}, AttnCase{1, 270, 2, 1, 8}, AttnCase{1, 70, 2, 1, 8, 20, {30, 40}},
        AttnCase{2, 9, 2, 2, 4, 3, {4, 1, 4}}}) {
    SCOPED_TRACE(tc.Name());
    auto qkv = Random(tc.batch * tc.seq * tc.width(), 5);
    auto dout = Random(tc.batch * tc.seq * tc.out_width(), 6);
    const AttnRun r = RunAttention(*ops, tc, qkv, &dout);
    testing::ExpectGradMatchesFiniteDiff(
        r.dqkv,
        [&](const std::vector<double>& v) {
          return testing::Dot(RefForward(v, tc, nullptr), dout);
        },
        qkv, 600, 1e-4, "dqkv");
  }
}

// Sliding windows and packed documents (Note [Attention masks]) across the blocks: windows of
// one key, of fewer keys than a block and of more than T; documents of one token, documents
// crossing block edges and ending on them; a window inside documents. Offsets (ring
// attention's blocks, Note [Ring attention]): causal past the diagonal, every key (offset T),
// with a window, with documents.
std::vector<AttnCase> MaskedCases() {
  return {{1, 600, 4, 2, 16, 100},
          {2, 300, 2, 1, 20, 1},
          {1, 130, 3, 3, 8, 1000},
          {1, 600, 4, 2, 16, 0, {5, 250, 1, 300, 44}},
          {2, 530, 2, 2, 64, 0, {256, 256, 18}},
          {1, 600, 3, 1, 24, 64, {100, 400, 100}},
          {1, 40, 2, 1, 8, 0, std::vector<int64_t>(40, 1)},
          {1, 300, 4, 2, 16, 0, {}, 100},
          {2, 130, 2, 1, 20, 50, {}, 64},
          {1, 600, 3, 1, 24, 0, {}, 600},
          {1, 200, 2, 2, 8, 0, {60, 140}, 40}};
}

TEST(AttentionTest, MaskedMatchesNaiveReference) {
  auto ops = MakeCpuOps();
  for (const AttnCase& tc : MaskedCases()) {
    SCOPED_TRACE(tc.Name());
    auto qkv = Random(tc.batch * tc.seq * tc.width(), 11);
    auto dout = Random(tc.batch * tc.seq * tc.out_width(), 12);
    const AttnRun r = RunAttention(*ops, tc, qkv, &dout);
    std::vector<double> ref_lse(r.lse.size());
    ExpectClose(r.out, RefForward(testing::ToDouble(qkv), tc, &ref_lse), 1e-5, "out");
    // A row that sees no key (an offset past a window) has lse -infinity on both sides, and
    // the rest are compared.
    std::vector<float> lse = r.lse;
    for (size_t i = 0; i < lse.size(); ++i) {
      ASSERT_EQ(std::isinf(lse[i]), std::isinf(ref_lse[i])) << "lse " << i;
      if (std::isinf(ref_lse[i])) lse[i] = 0.0f, ref_lse[i] = 0.0;
    }
    ExpectClose(lse, ref_lse, 1e-5, "lse");
    ExpectClose(r.dqkv, RefBackward(testing::ToDouble(qkv), dout, tc), 1e-5, "dqkv");
  }
}

// A packed row gives each document what the document gives alone (as its own sequence):
// Hugging Face's DataCollatorWithFlattening contract for attention.
TEST(AttentionTest, PackedDocumentsEqualTheDocumentsOneByOne) {
  auto ops = MakeCpuOps();
  const AttnCase packed{1, 600, 4, 2, 16, 0, {5, 250, 1, 300, 44}};
  auto qkv = Random(packed.seq * packed.width(), 13);
  auto dout = Random(packed.seq * packed.out_width(), 14);
  const AttnRun whole = RunAttention(*ops, packed, qkv, &dout);
  int64_t start = 0;
  for (int64_t len : packed.doc_lengths) {
    SCOPED_TRACE("document at " + std::to_string(start) + " of " + std::to_string(len));
    const AttnCase alone{1, len, packed.heads, packed.kv_heads, packed.head_dim};
    const int64_t w = packed.width(), ow = packed.out_width();
    std::vector<float> doc_qkv(qkv.begin() + start * w, qkv.begin() + (start + len) * w);
    std::vector<float> doc_dout(dout.begin() + start * ow, dout.begin() + (start + len) * ow);
    const AttnRun one = RunAttention(*ops, alone, doc_qkv, &doc_dout);
    auto rows = [&](const std::vector<float>& v, int64_t width) {
      return std::vector<float>(v.begin() + start * width, v.begin() + (start + len) * width);
    };
    ExpectClose(rows(whole.out, ow), testing::ToDouble(one.out), 1e-5, "out");
    ExpectClose(rows(whole.dqkv, w), testing::ToDouble(one.dqkv), 1e-5, "dqkv");
    for (int64_t h = 0; h < packed.heads; ++h) {
      for (int64_t t = 0; t < len; ++t) {
        EXPECT_NEAR(whole.lse[h * packed.seq + start + t], one.lse[h * len + t], 1e-5);
      }
    }
    start += len;
  }
}

TEST(AttentionTest, RejectsBadMasks) {
  auto ops = MakeCpuOps();
  // NH = NKV = 1, HS = 2, B = 1, T = 4: qkv [1, 4, 6], out [1, 4, 2], lse [1, 1, 4].
  std::vector<float> qkv(24, 0.5f), out(8), lse(4), dqkv(24);
  const Tensor qkv_t = View(qkv, {1, 4, 6}), out_t = View(out, {1, 4, 2}),
               lse_t = View(lse, {1, 1, 4});
  const AttentionHeads heads{1, 1, 2};
  auto forward = [&](const AttentionMask& mask) {
    ops->AttentionForward(qkv_t, heads, mask, out_t, lse_t);
  };
  ExpectErrorMentions(
      [&] {
        forward({-1, {}});
      },
      {"AttentionForward", "sliding window is -1", "0 for none"});
  std::vector<int32_t> pos = {0, 1, 5, 0};
  ExpectErrorMentions(
      [&] {
        forward({0, Tensor(pos.data(), DType::kI32, {1, 4})});
      },
      {"AttentionForward", "positions[0][2] = 5 after 1", "count up by one"});
  pos = {-1, 0, 1, 2};
  ExpectErrorMentions(
      [&] {
        forward({0, Tensor(pos.data(), DType::kI32, {1, 4})});
      },
      {"positions[0][0] = -1 at the start"});
  pos = {1, 2, 3, 4};  // a document that began before these rows: fine
  EXPECT_NO_THROW(forward({0, Tensor(pos.data(), DType::kI32, {1, 4})}));
  pos = {0, 1, 2, 3};
  ExpectErrorMentions(
      [&] {
        forward({0, Tensor(pos.data(), DType::kI32, {4})});
      },
      {"AttentionForward", "positions"});
  std::vector<float> float_pos = {0.0f, 1.0f, 2.0f, 3.0f};
  ExpectErrorMentions([&] { forward({0, View(float_pos, {1, 4})}); },
                      {"AttentionForward", "positions"});
  ExpectErrorMentions(
      [&] {
        ops->AttentionBackward(out_t, qkv_t, out_t, lse_t, heads,
                               {0, Tensor(pos.data(), DType::kI32, {2, 2})}, View(dqkv, {1, 4, 6}));
      },
      {"AttentionBackward", "positions"});
}

// The AttentionHeads form with NKV = NH and HS = C / NH is GPT-2's int form, bit for bit.
TEST(AttentionTest, HeadsFormWithAllKvHeadsIsTheMultiHeadForm) {
  auto ops = MakeCpuOps();
  for (const AttnCase& tc : kMultiHeadCases) {
    SCOPED_TRACE(tc.Name());
    auto qkv = Random(tc.batch * tc.seq * tc.width(), 7);
    auto dout = Random(tc.batch * tc.seq * tc.out_width(), 8);
    const AttnRun by_int = RunAttention(*ops, tc, qkv, &dout, true),
                  by_heads = RunAttention(*ops, tc, qkv, &dout);
    EXPECT_EQ(by_heads.out, by_int.out);
    EXPECT_EQ(by_heads.lse, by_int.lse);
    EXPECT_EQ(by_heads.dqkv, by_int.dqkv);
  }
}

// Hugging Face's repeat_kv: the multi-head qkv [B,T,3*NH*HS] in which query head h has its own
// copy of the k and v of KV head h / (NH / NKV).
std::vector<float> RepeatKv(const std::vector<float>& qkv, const AttnCase& tc) {
  const int64_t hs = tc.head_dim, qw = tc.out_width(), rows = tc.batch * tc.seq;
  std::vector<float> rep(rows * 3 * qw);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = qkv.data() + r * tc.width();
    float* dst = rep.data() + r * 3 * qw;
    std::copy(src, src + qw, dst);
    for (int64_t h = 0; h < tc.heads; ++h) {
      std::copy(src + tc.KCol(h), src + tc.KCol(h) + hs, dst + qw + h * hs);
      std::copy(src + tc.VCol(h), src + tc.VCol(h) + hs, dst + 2 * qw + h * hs);
    }
  }
  return rep;
}

// Grouped-query attention is multi-head attention on the repeated KV heads: the same out and
// lse and the same dq bit for bit, and each KV head's dk / dv is the fp32 sum of its
// repeated copies' gradients, added in head order.
TEST(AttentionTest, GroupedEqualsMultiHeadOnRepeatedKvHeads) {
  auto ops = MakeCpuOps();
  for (const AttnCase& tc : kGroupedCases) {
    SCOPED_TRACE(tc.Name());
    auto qkv = Random(tc.batch * tc.seq * tc.width(), 9);
    auto dout = Random(tc.batch * tc.seq * tc.out_width(), 10);
    std::vector<float> rep = RepeatKv(qkv, tc);
    const AttnCase mha{tc.batch, tc.seq, tc.heads, tc.heads, tc.head_dim};
    const AttnRun grouped = RunAttention(*ops, tc, qkv, &dout),
                  repeated = RunAttention(*ops, mha, rep, &dout);
    EXPECT_EQ(grouped.out, repeated.out);
    EXPECT_EQ(grouped.lse, repeated.lse);
    std::vector<float> want(qkv.size(), 0.0f);
    const int64_t hs = tc.head_dim, qw = tc.out_width();
    for (int64_t r = 0; r < tc.batch * tc.seq; ++r) {
      const float* g = repeated.dqkv.data() + r * 3 * qw;
      float* w = want.data() + r * tc.width();
      std::copy(g, g + qw, w);
      for (int64_t h = 0; h < tc.heads; ++h) {  // in head order, as the contract's sum
        for (int64_t d = 0; d < hs; ++d) {
          w[tc.KCol(h) + d] += g[qw + h * hs + d];
          w[tc.VCol(h) + d] += g[2 * qw + h * hs + d];
        }
      }
    }
    EXPECT_EQ(grouped.dqkv, want);
  }
}

TEST(AttentionTest, RejectsBadHeadsAndShapes) {
  auto ops = MakeCpuOps();
  std::vector<float> qkv(2 * 3 * 12), out(2 * 12), lse(2 * 5), dqkv(qkv.size());
  const Tensor qkv_t = View(qkv, {1, 2, 36}), out_t = View(out, {1, 2, 12});
  ExpectErrorMentions([&] { ops->AttentionForward(qkv_t, 5, out_t, View(lse, {1, 5, 2})); },
                      {"AttentionForward", "num_heads = 5", "C = 12"});
  ExpectErrorMentions([&] { ops->AttentionForward(qkv_t, 0, out_t, View(lse, {1, 5, 2})); },
                      {"AttentionForward", "num_heads"});
  ExpectErrorMentions([&] { ops->AttentionForward(qkv_t, 3, out_t, View(lse, {1, 2, 5})); },
                      {"AttentionForward", "lse", "[1, 3, 2]"});
  ExpectErrorMentions([&] { ops->AttentionForward(View(qkv, {1, 3, 24}), 2, out_t,
                                                  View(lse, {1, 2, 5})); },
                      {"AttentionForward", "out"});
  std::vector<float> lse6(6);
  ExpectErrorMentions([&] { ops->AttentionBackward(View(out, {2, 12}), qkv_t, out_t,
                                                   View(lse6, {1, 3, 2}), 3,
                                                   View(dqkv, {1, 2, 36})); },
                      {"AttentionBackward", "dout"});
}

TEST(AttentionTest, RejectsBadGroupedHeadsAndShapes) {
  auto ops = MakeCpuOps();
  // NH = 4, NKV = 2, HS = 3: qkv [1, 2, 24], out [1, 2, 12], lse [1, 4, 2].
  std::vector<float> qkv(2 * 24), out(2 * 12), lse(8), dqkv(qkv.size()), small(2 * 8);
  const Tensor qkv_t = View(qkv, {1, 2, 24}), out_t = View(out, {1, 2, 12});
  const Tensor lse_t = View(lse, {1, 4, 2}), dqkv_t = View(dqkv, {1, 2, 24});
  auto forward = [&](AttentionHeads h) { ops->AttentionForward(qkv_t, h, out_t, lse_t); };
  ExpectErrorMentions(
      [&] {
        forward({4, 3, 3});
      },
      {"AttentionForward", "num_kv_heads = 3", "divide num_heads = 4"});
  ExpectErrorMentions([&] { forward({4, 0, 3}); }, {"AttentionForward", "num_kv_heads = 0"});
  ExpectErrorMentions([&] { forward({4, 2, 0}); }, {"AttentionForward", "head_dim = 0"});
  ExpectErrorMentions(
      [&] {
        forward({4, 1, 3});
      },  // a qkv width of (4 + 2) * 3
      {"AttentionForward", "qkv", "[1, 2, 24]", "[B, T, 18]"});
  ExpectErrorMentions(
      [&] {
        ops->AttentionForward(qkv_t, {4, 2, 3}, View(small, {1, 2, 8}), lse_t);
      },
      {"AttentionForward", "out", "[1, 2, 12]"});
  ExpectErrorMentions(
      [&] {
        ops->AttentionBackward(out_t, qkv_t, out_t, lse_t, {4, 4, 3}, dqkv_t);
      },
      {"AttentionBackward", "qkv", "[B, T, 36]"});
  ExpectErrorMentions(
      [&] {
        ops->AttentionBackward(out_t, qkv_t, out_t, lse_t, {4, 2, 3}, View(dqkv, {2, 24}));
      },
      {"AttentionBackward", "dqkv"});
  // GPT-2's form on a 2-D qkv: the shape is what is wrong, not the head_dim it implies.
  ExpectErrorMentions(
      [&] {
        ops->AttentionForward(View(qkv, {2, 24}), 4, out_t, lse_t);
      },
      {"AttentionForward", "qkv", "[2, 24]", "[B, T,"});
}

}  // namespace
}  // namespace ztrain::kernels
