// GPT-2's layers on MegatronLinears against the same layers on the single-process linears (DESIGN.md "The equivalence
// rule"), under mpirun at 2 and 4 ranks (at 4 also as two tp groups of 2). Each rank builds
// the single-process layer with the whole parameter values and the tp layer with its slices
// of the same values, runs both on the same batch and upstream gradient, and compares the
// outputs, input gradients and every parameter gradient (the local gradient against the same
// slice of the whole one), and counts the collectives.
#include "parallel/tensor/megatron_linears.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/error.h"
#include "nn/gpt2.h"
#include "tests/expect_error.h"
#include "tests/rounding_model.h"
#include "tests/parallel/mpi_test_env.h"
#include "tests/parallel/tensor/tp_test_util.h"

namespace ztrain::tensor::test {
namespace {

// Close(): max |got - ref| / max |ref| over a tensor. The tp layers reorder fp32 sums (partial
// matmul products summed across ranks, the loss's max and sum of exp split by vocabulary):
// Note [Equivalence tolerances] bounds what that moves by OpsTolerance, for the longest sum of
// TinyModel (its padded vocabulary and 4 C, 128 terms) and the ops in sequence of the whole
// model (2 blocks of layernorm, QKV, attention, projection and MLP, then the head: 12); a
// wrong slice, a bias added twice or a missing all-reduce moves them by O(1).
constexpr int64_t kB = 2, kT = 8;
const double kTol = testing::OpsTolerance(128, 12);

std::shared_ptr<const nn::LinearProvider> Whole() { return nn::MakeWholeLinears(); }
std::shared_ptr<const nn::LinearProvider> Megatron(comm::Communicator& tp) {
  return std::make_shared<const MegatronLinears>(tp);
}

std::vector<nn::Layer*> Raw(const std::vector<std::unique_ptr<nn::Layer>>& layers) {
  std::vector<nn::Layer*> raw;
  for (const auto& l : layers) raw.push_back(l.get());
  return raw;
}

// Every tp gradient equals its slice of the single-process gradient; whole (replicated)
// parameters' gradients are also bit-identical across the group. Collective over `tp`.
void ExpectGradsMatch(comm::Communicator& tp, const ParamStore& got, const ParamStore& ref) {
  for (const auto& [name, e] : got.entries()) {
    const ParamStore::Entry& whole = ref.at(name);
    double max_abs = 0.0;
    for (float g : whole.grad) max_abs = std::max(max_abs, static_cast<double>(std::fabs(g)));
    EXPECT_GT(max_abs, 0.0) << name << ": the reference gradient is all zero";
    EXPECT_TRUE(Close(e.grad, LocalSlice(e.spec, whole.grad), kTol)) << name;
    if (!e.spec.tp.split()) {
      EXPECT_TRUE(SameOnAllRanks(tp, e.grad)) << name;
    }
  }
}

TEST(TensorParallelTest, EmbeddingMatchesSingleProcess) {
  const ModelConfig m = TinyModel();
  for (int tp_size : TpSizes()) {
    SCOPED_TRACE("tp size " + std::to_string(tp_size));
    const auto tp = TpGroup(tp_size);
    const auto single_layer = nn::Gpt2Embedding(m, Whole());
    const auto par_layer = nn::Gpt2Embedding(m, Megatron(*tp));
    nn::Layer &single = *single_layer, &par = *par_layer;
    const ParamStore ref_params({&single}), tp_params({&par});
    const Batch batch(kB, kT, m.vocab_size);
    const std::vector<float> dout = Normal("dout", kB * kT * m.n_embd);
    const Pass ref = RunPass({&single}, batch.mb, {}, dout, nullptr);
    const Pass got = RunPass({&par}, batch.mb, {}, dout, tp.get());
    // One rank contributes each row and the others add zeros: exact.
    EXPECT_TRUE(Close(got.output, ref.output, 0.0));
    EXPECT_TRUE(SameOnAllRanks(*tp, got.output));
    ExpectGradsMatch(*tp, tp_params, ref_params);
    EXPECT_EQ(got.forward_all_reduces, 1);
    EXPECT_EQ(got.forward_ops, 1);
    EXPECT_EQ(got.backward_ops, 0);
  }
}

TEST(TensorParallelTest, TransformerBlockMatchesSingleProcess) {
  const ModelConfig m = TinyModel();
  for (int tp_size : TpSizes()) {
    SCOPED_TRACE("tp size " + std::to_string(tp_size));
    const auto tp = TpGroup(tp_size);
    const auto single_layer = nn::Gpt2Block(m, 1, Whole());
    const auto par_layer = nn::Gpt2Block(m, 1, Megatron(*tp));
    nn::Layer &single = *single_layer, &par = *par_layer;
    const ParamStore ref_params({&single}), tp_params({&par});
    const Batch batch(kB, kT, m.vocab_size);
    const std::vector<float> x = Normal("x", kB * kT * m.n_embd);
    const std::vector<float> dy = Normal("dy", kB * kT * m.n_embd);
    const Pass ref = RunPass({&single}, batch.mb, x, dy, nullptr);
    const Pass got = RunPass({&par}, batch.mb, x, dy, tp.get());
    EXPECT_TRUE(Close(got.output, ref.output, kTol));
    EXPECT_TRUE(Close(got.dinput, ref.dinput, kTol));
    EXPECT_TRUE(SameOnAllRanks(*tp, got.output));
    EXPECT_TRUE(SameOnAllRanks(*tp, got.dinput));
    ExpectGradsMatch(*tp, tp_params, ref_params);
    // Megatron's g after each row-parallel linear, f before each column-parallel one.
    EXPECT_EQ(got.forward_all_reduces, 2);
    EXPECT_EQ(got.backward_all_reduces, 2);
    EXPECT_EQ(got.forward_ops + got.backward_ops, 4);
  }
}

// Note [Sequence parallelism]: a block on its piece's rows gives those rows of the
// single-process output and input gradient, every gradient (the norms' summed over the
// pieces), keeps 1/P of the norms' and the residual's saved rows, and moves in forward the
// bytes of the all-reduces it replaces (an all-gather and a reduce-scatter each).
TEST(TensorParallelTest, SequenceParallelBlockKeepsItsPieceOfTheRows) {
  const ModelConfig m = TinyModel();
  for (int tp_size : TpSizes()) {
    SCOPED_TRACE("tp size " + std::to_string(tp_size));
    const auto tp = TpGroup(tp_size);
    const int64_t p = tp->size(), n = kB * kT, c = m.n_embd, rows = n / p;
    const auto single_layer = nn::Gpt2Block(m, 1, Whole());
    const auto plain_layer = nn::Gpt2Block(m, 1, Megatron(*tp));
    const auto sp_layer = nn::Gpt2Block(m, 1, std::make_shared<const MegatronLinears>(*tp, true));
    nn::Layer &single = *single_layer, &plain = *plain_layer, &sp = *sp_layer;
    const ParamStore ref_params({&single}), plain_params({&plain}), sp_params({&sp});
    const Batch batch(kB, kT, m.vocab_size);
    const std::vector<float> x = Normal("x", n * c), dy = Normal("dy", n * c);
    const auto piece = [&](const std::vector<float>& v) {
      const auto first = v.begin() + tp->rank() * rows * c;
      return std::vector<float>(first, first + rows * c);
    };
    const Pass ref = RunPass({&single}, batch.mb, x, dy, nullptr);
    const Pass base = RunPass({&plain}, batch.mb, x, dy, tp.get());
    const Pass got = RunPass({&sp}, batch.mb, piece(x), piece(dy), tp.get(), {kB, kT / p, c});
    EXPECT_TRUE(Close(got.output, piece(ref.output), kTol));
    EXPECT_TRUE(Close(got.dinput, piece(ref.dinput), kTol));
    ExpectGradsMatch(*tp, sp_params, ref_params);
    // Saved: ln1, res and ln2 [N, C] and the two layernorms' mean and rstd [N], fp32.
    EXPECT_EQ(base.saved_bytes - got.saved_bytes, (3 * c + 4) * 4 * (n - rows));
    // Forward: two all-gathers and two reduce-scatters, no all-reduce, the same bus bytes.
    EXPECT_EQ(got.forward_all_reduces, 0);
    EXPECT_EQ(got.forward_ops, 4);
    EXPECT_EQ(got.forward_bytes, base.forward_bytes);
    // Backward: the output gradient and the normed input gathered for each linear pair, the
    // input gradient reduce-scattered, and the norms' parameter gradients all-reduced.
    const int64_t full = n * c * 4, bus = (p - 1) * full / p;
    EXPECT_EQ(got.backward_all_reduces, 2);
    EXPECT_EQ(got.backward_ops, 8);
    EXPECT_EQ(got.backward_bytes, 6 * bus + 2 * (2 * (p - 1) * (2 * c * 4) / p));
  }
}

TEST(TensorParallelTest, LmHeadMatchesSingleProcessWithoutGatheringLogits) {
  const ModelConfig m = TinyModel();  // at tp 4 the last vocabulary slice is all padding
  const int64_t n = kB * kT;
  for (int tp_size : TpSizes()) {
    SCOPED_TRACE("tp size " + std::to_string(tp_size));
    const auto tp = TpGroup(tp_size);
    const auto single_layer = nn::Gpt2Head(m, Whole());
    const auto par_layer = nn::Gpt2Head(m, Megatron(*tp));
    nn::Layer &single = *single_layer, &par = *par_layer;
    const ParamStore ref_params({&single}), tp_params({&par});
    const Batch batch(kB, kT, m.vocab_size);
    const std::vector<float> x = Normal("x", n * m.n_embd, 3.0f);
    const std::vector<float> dloss = Normal("dloss", n, 1.0f / static_cast<float>(n));
    const Pass ref = RunPass({&single}, batch.mb, x, dloss, nullptr);
    const Pass got = RunPass({&par}, batch.mb, x, dloss, tp.get());
    EXPECT_TRUE(Close(got.output, ref.output, kTol));
    EXPECT_TRUE(Close(got.dinput, ref.dinput, kTol));
    EXPECT_TRUE(SameOnAllRanks(*tp, got.output));
    EXPECT_TRUE(SameOnAllRanks(*tp, got.dinput));
    ExpectGradsMatch(*tp, tp_params, ref_params);  // "wte", the tied storage
    // Forward: the max, then the sum of exp with the target logit; backward: dx.
    EXPECT_EQ(got.forward_all_reduces, 2);
    EXPECT_EQ(got.backward_all_reduces, 1);
    EXPECT_EQ(got.forward_ops + got.backward_ops, 3);
    // 3 floats per token cross ranks (an all-reduce moves < 2x its buffer per rank), far
    // below the n * Vp floats that gathering the logits would move.
    EXPECT_LE(got.forward_bytes, 2 * 3 * n * static_cast<int64_t>(sizeof(float)));
    EXPECT_LE(got.backward_bytes, 2 * n * m.n_embd * static_cast<int64_t>(sizeof(float)));
  }
}

TEST(TensorParallelTest, WholeModelMatchesSingleProcess) {
  const ModelConfig m = TinyModel();
  for (int tp_size : TpSizes()) {
    SCOPED_TRACE("tp size " + std::to_string(tp_size));
    const auto tp = TpGroup(tp_size);
    const auto single = nn::BuildGpt2(m);
    const auto par = BuildParallelModel(m, *tp);
    const ParamStore ref_params(Raw(single)), tp_params(Raw(par));
    const Batch batch(kB, kT, m.vocab_size);
    const std::vector<float> dloss(kB * kT, 1.0f / (kB * kT));  // d(mean loss)
    const Pass ref = RunPass(Raw(single), batch.mb, {}, dloss, nullptr);
    const Pass got = RunPass(Raw(par), batch.mb, {}, dloss, tp.get());
    EXPECT_TRUE(Close(got.output, ref.output, kTol));
    EXPECT_TRUE(SameOnAllRanks(*tp, got.output));
    ExpectGradsMatch(*tp, tp_params, ref_params);
    // Embedding 1 + 2 per block + loss 2 forward; 2 per block + LM head 1 backward.
    EXPECT_EQ(got.forward_all_reduces, 1 + 2 * m.n_layer + 2);
    EXPECT_EQ(got.backward_all_reduces, 2 * m.n_layer + 1);
    EXPECT_EQ(got.forward_ops + got.backward_ops, 4 * m.n_layer + 4);
  }
}

TEST(TensorParallelTest, ParamsKeepNamesAndDescribeTheirSlices) {
  const ModelConfig m = TinyModel();
  // (dim, groups) of every split parameter, by name without the block prefix.
  const std::map<std::string, std::pair<int, int>> split = {{"wte", {0, 1}},
                                                            {"lm_head.weight", {0, 1}},
                                                            {"attn.c_attn.weight", {0, 3}},
                                                            {"attn.c_attn.bias", {0, 3}},
                                                            {"attn.c_proj.weight", {1, 1}},
                                                            {"mlp.c_fc.weight", {0, 1}},
                                                            {"mlp.c_fc.bias", {0, 1}},
                                                            {"mlp.c_proj.weight", {1, 1}}};
  for (int tp_size : TpSizes()) {
    SCOPED_TRACE("tp size " + std::to_string(tp_size));
    const auto tp = TpGroup(tp_size);
    const auto single = nn::BuildGpt2(m);
    const auto par = BuildParallelModel(m, *tp);
    ASSERT_EQ(par.size(), single.size());
    for (size_t l = 0; l < par.size(); ++l) {
      EXPECT_EQ(par[l]->Name(), single[l]->Name());
      // Each rank does 1/P of the matmul work, so the group does the whole model's.
      EXPECT_DOUBLE_EQ(par[l]->ForwardFlopsPerToken(kT) * tp_size,
                       single[l]->ForwardFlopsPerToken(kT));
      const auto got = par[l]->Params(), want = single[l]->Params();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        const nn::ParamSpec &g = got[i], &w = want[i];
        SCOPED_TRACE(w.name);
        EXPECT_EQ(g.name, w.name);
        EXPECT_EQ(g.tied_to, w.tied_to);
        EXPECT_EQ(g.init, w.init);
        EXPECT_EQ(g.init_std, w.init_std);
        const std::string key =
            w.name.rfind("h.", 0) == 0 ? w.name.substr(w.name.find('.', 2) + 1) : w.name;
        const auto it = split.find(key);
        if (it == split.end()) {
          EXPECT_FALSE(g.tp.split());
          EXPECT_EQ(g.shape, w.shape);
          continue;
        }
        ASSERT_TRUE(g.tp.split());
        EXPECT_EQ(g.tp.full_shape, w.shape);
        EXPECT_EQ(g.tp.dim, it->second.first);
        EXPECT_EQ(g.tp.groups, it->second.second);
        EXPECT_EQ(g.tp.parts, tp_size);
        EXPECT_EQ(g.tp.part, tp->rank());
        Shape local = w.shape;
        local[static_cast<size_t>(g.tp.dim)] /= tp_size;
        EXPECT_EQ(g.shape, local);
      }
    }
  }
}

TEST(TensorParallelTest, RefusesModelsThatDoNotSplitNamingTheKeys) {
  using ztrain::testing::ExpectErrorWith;
  for (int tp_size : TpSizes()) {
    SCOPED_TRACE("tp size " + std::to_string(tp_size));
    const auto tp = TpGroup(tp_size);
    const std::string size = " does not divide by tensor_parallel.size " + std::to_string(tp_size);
    ModelConfig heads = TinyModel();
    heads.n_head = 3;
    heads.n_embd = 48;
    ExpectErrorWith<ConfigError>([&] { BuildParallelModel(heads, *tp); },
                                 {"model.n_head 3" + size, "(1, 3)"});
    ModelConfig vocab = TinyModel();
    vocab.padded_vocab_size = 129;
    ExpectErrorWith<ConfigError>([&] { BuildParallelModel(vocab, *tp); },
                                 {"model.padded_vocab_size 129" + size, "e.g. 128"});
    ModelConfig both = heads;
    both.padded_vocab_size = 129;
    ExpectErrorWith<ConfigError>([&] { BuildParallelModel(both, *tp); },
                                 {"model.n_head 3" + size, "\nmodel.padded_vocab_size 129"});
  }
  EXPECT_NO_THROW(nn::CheckTensorParallelModel(TinyModel(), 4));
  ExpectErrorWith<ConfigError>([] { nn::CheckTensorParallelModel(TinyModel(), 5); },
                               {"model.n_head 4 does not divide by tensor_parallel.size 5",
                                "model.n_embd 32 does not divide", "e.g. 640"});
}

// A group of one: BuildParallelModel is BuildModel, and MegatronLinears itself (no split,
// collectives of one rank) computes what the single-process linears do.
TEST(TensorParallelTest, GroupOfOneIsTheSingleProcessModel) {
  const ModelConfig m = TinyModel();
  const auto self = comm::MakeSelfCommunicator();
  const auto single = nn::BuildGpt2(m);
  const auto built = BuildParallelModel(m, *self);
  ASSERT_EQ(built.size(), single.size());
  for (size_t l = 0; l < built.size(); ++l) {
    const auto got = built[l]->Params(), want = single[l]->Params();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].name, want[i].name);
      EXPECT_EQ(got[i].shape, want[i].shape);
      EXPECT_FALSE(got[i].tp.split()) << got[i].name;
    }
  }
  const auto par = nn::FindModelFamily(m.type).build(m, Megatron(*self));
  const ParamStore ref_params(Raw(single)), tp_params(Raw(par));
  const Batch batch(kB, kT, m.vocab_size);
  const std::vector<float> dloss = Normal("dloss", kB * kT);
  const Pass ref = RunPass(Raw(single), batch.mb, {}, dloss, nullptr);
  const Pass got = RunPass(Raw(par), batch.mb, {}, dloss, self.get());
  EXPECT_TRUE(Close(got.output, ref.output, kTol));
  for (const auto& [name, e] : tp_params.entries()) {
    EXPECT_TRUE(Close(e.grad, ref_params.at(name).grad, kTol)) << name;
  }
}

}  // namespace
}  // namespace ztrain::tensor::test

namespace ztrain::tensor::test {
namespace {

// The Llama family's layers (no position table, grouped-query attention with q/k/v packed,
// RoPE, SwiGLU, an untied head) on MegatronLinears against the single-process ones.
ModelConfig TinyLlama() {
  ModelConfig m = TinyModel();
  m.type = "llama";
  m.n_kv_head = 2;
  m.head_dim = 6;
  m.intermediate_size = 20;
  m.rope_theta = 100.0;
  m.tie_word_embeddings = false;
  m.qkv_bias = true;
  return m;
}

TEST(TensorParallelTest, LlamaLayersMatchSingleProcess) {
  const ModelConfig m = TinyLlama();
  for (int tp_size : TpSizes()) {
    if (m.n_kv_head % tp_size != 0) continue;
    SCOPED_TRACE("tp size " + std::to_string(tp_size));
    const auto tp = TpGroup(tp_size);
    const auto single = nn::BuildModel(m);
    const auto par = BuildParallelModel(m, *tp);
    const Batch batch(kB, kT, m.vocab_size);
    for (size_t l = 0; l < single.size(); ++l) {
      SCOPED_TRACE(single[l]->Name());
      const ParamStore ref_params({single[l].get()}), tp_params({par[l].get()});
      const bool first = l == 0, last = l + 1 == single.size();
      const std::vector<float> x = first ? std::vector<float>() : Normal("x", kB * kT * m.n_embd);
      const std::vector<float> dy =
          last ? std::vector<float>(kB * kT, 1.0f / (kB * kT)) : Normal("dy", kB * kT * m.n_embd);
      const Pass ref = RunPass({single[l].get()}, batch.mb, x, dy, nullptr);
      const Pass got = RunPass({par[l].get()}, batch.mb, x, dy, tp.get());
      EXPECT_TRUE(Close(got.output, ref.output, kTol));
      if (!first) {
        EXPECT_TRUE(Close(got.dinput, ref.dinput, kTol));
      }
      for (const auto& [name, e] : tp_params.entries()) {
        EXPECT_TRUE(Close(e.grad, LocalSlice(e.spec, ref_params.at(name).grad), kTol)) << name;
      }
    }
  }
}

}  // namespace
}  // namespace ztrain::tensor::test
