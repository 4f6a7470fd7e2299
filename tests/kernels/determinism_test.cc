// The reductions the CPU kernels own give bit-identical results for any thread count (the
// equivalence rule in DESIGN.md needs runs with different layouts to agree).
#include <omp.h>

#include <functional>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace ztrain::kernels {
namespace {

using testing::Random;
using testing::RandomInts;
using testing::View;

// Runs fn with 1 and then 3 OpenMP threads and returns both results.
template <typename T>
std::pair<T, T> WithOneAndThreeThreads(const std::function<T()>& fn) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  T one = fn();
  omp_set_num_threads(3);
  T three = fn();
  omp_set_num_threads(saved);
  return {one, three};
}

TEST(DeterminismTest, GradientReductionsDoNotDependOnThreadCount) {
  auto ops = MakeCpuOps();
  const int64_t batch = 4, seq = 64, ch = 192, vocab = 50;
  auto tokens = RandomInts(batch * seq, 1, 0, 8);  // many repeated tokens
  auto dout = Random(batch * seq * ch, 2), x = Random(batch * seq * ch, 3);
  auto w = Random(ch, 4), b = Random(ch, 5), lin_w = Random(ch * ch, 6);
  auto run = [&]() -> std::vector<float> {
    std::vector<float> dwte(vocab * ch, 0.0f), dwpe(seq * ch, 0.0f);
    ops->EmbeddingBackward(View(dout, {batch, seq, ch}), View(tokens, {batch, seq}),
                           View(dwte, {vocab, ch}), View(dwpe, {seq, ch}));
    std::vector<float> y(x.size()), mean(batch * seq), rstd(batch * seq), dx(x.size());
    std::vector<float> dw(ch, 0.0f), db(ch, 0.0f), lin_dw(ch * ch, 0.0f), lin_db(ch, 0.0f);
    const Tensor xt = View(x, {batch * seq, ch});
    ops->LayerNormForward(xt, View(w, {ch}), View(b, {ch}), View(y, {batch * seq, ch}),
                          View(mean, {batch * seq}), View(rstd, {batch * seq}));
    ops->LayerNormBackward(View(dout, {batch * seq, ch}), xt, View(w, {ch}),
                           View(mean, {batch * seq}), View(rstd, {batch * seq}),
                           View(dx, {batch * seq, ch}), View(dw, {ch}), View(db, {ch}));
    ops->LinearBackward(View(dout, {batch * seq, ch}), xt, View(lin_w, {ch, ch}), Tensor(),
                        View(lin_dw, {ch, ch}), View(lin_db, {ch}));
    std::vector<float> rms_y(x.size()), rms_rstd(batch * seq), rms_dx(x.size()), rms_dw(ch, 0.0f);
    ops->RmsNormForward(xt, View(w, {ch}), 1e-5f, View(rms_y, {batch * seq, ch}),
                        View(rms_rstd, {batch * seq}));
    ops->RmsNormBackward(View(dout, {batch * seq, ch}), xt, View(w, {ch}),
                         View(rms_rstd, {batch * seq}), View(rms_dx, {batch * seq, ch}),
                         View(rms_dw, {ch}));
    std::vector<float> all = dwte;
    for (const auto* v : {&dwpe, &dx, &dw, &db, &lin_db, &rms_dx, &rms_dw}) {
      all.insert(all.end(), v->begin(), v->end());
    }
    all.push_back(static_cast<float>(ops->SumSquares(View(dout, {int64_t(dout.size())}))));
    return all;
  };
  const auto [one, three] = WithOneAndThreeThreads<std::vector<float>>(run);
  EXPECT_EQ(one, three);
}

// Multi-head (GPT-2), grouped-query and multi-query heads: a KV head's gradient sums over
// its query heads in one order whatever the thread count.
TEST(DeterminismTest, AttentionDoesNotDependOnThreadCount) {
  auto ops = MakeCpuOps();
  const int64_t batch = 2, seq = 130;
  for (const AttentionHeads heads :
       {AttentionHeads{3, 3, 16}, AttentionHeads{6, 2, 16}, AttentionHeads{4, 1, 24}}) {
    SCOPED_TRACE("NH=" + std::to_string(heads.num_heads) +
                 " NKV=" + std::to_string(heads.num_kv_heads));
    const int64_t width = heads.qkv_width(), ow = heads.q_width();
    auto qkv = Random(batch * seq * width, 7), dout = Random(batch * seq * ow, 8);
    auto run = [&]() -> std::vector<float> {
      std::vector<float> out(batch * seq * ow), lse(batch * heads.num_heads * seq);
      std::vector<float> dqkv(qkv.size());
      const Tensor qkv_t = View(qkv, {batch, seq, width}), out_t = View(out, {batch, seq, ow});
      const Tensor lse_t = View(lse, {batch, heads.num_heads, seq});
      ops->AttentionForward(qkv_t, heads, out_t, lse_t);
      ops->AttentionBackward(View(dout, {batch, seq, ow}), qkv_t, out_t, lse_t, heads,
                             View(dqkv, {batch, seq, width}));
      out.insert(out.end(), dqkv.begin(), dqkv.end());
      return out;
    };
    const auto [one, three] = WithOneAndThreeThreads<std::vector<float>>(run);
    EXPECT_EQ(one, three);
  }
}

}  // namespace
}  // namespace ztrain::kernels
