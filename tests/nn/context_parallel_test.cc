// Note [Context parallelism] (nn/context_parallel.h): the pieces of a micro-batch, Ulysses' head
// groups, and its two exchanges over P ranks played by P threads with an in-process all-to-all
// (the real one is MPI's: layout_equivalence_test --cp).
#include "nn/context_parallel.h"

#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "core/memory_tracker.h"
#include "kernels/ops.h"

namespace ztrain::nn {
namespace {

std::vector<int32_t> Values(const Tensor& t) {
  return {t.data<int32_t>(), t.data<int32_t>() + t.numel()};
}

TEST(ContextParallelTest, PiecesKeepTheirGlobalPositions) {
  std::vector<int32_t> tokens(16), targets(16);
  std::iota(tokens.begin(), tokens.end(), 100);
  std::iota(targets.begin(), targets.end(), 200);
  MicroBatch whole{Tensor(tokens.data(), DType::kI32, {2, 8}),
                   Tensor(targets.data(), DType::kI32, {2, 8})};
  const ContextMicroBatch piece(whole, 2, 4);  // tokens 4, 5 of each row
  EXPECT_EQ(piece.mb.tokens.shape(), (Shape{2, 2}));
  EXPECT_EQ(Values(piece.mb.tokens), (std::vector<int32_t>{104, 105, 112, 113}));
  EXPECT_EQ(Values(piece.mb.targets), (std::vector<int32_t>{204, 205, 212, 213}));
  EXPECT_EQ(Values(piece.mb.positions), (std::vector<int32_t>{4, 5, 4, 5}));
  EXPECT_FALSE(piece.mb.whole_positions.defined());

  // Packed documents: the pieces' positions are the whole sequence's document positions, and
  // the whole sequences' positions come along for the mask.
  std::vector<int32_t> packed = {0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 0, 1, 2, 3, 0, 1};
  whole.positions = Tensor(packed.data(), DType::kI32, {2, 8});
  const ContextMicroBatch second(whole, 1, 2);
  EXPECT_EQ(Values(second.mb.positions), (std::vector<int32_t>{1, 2, 3, 4, 2, 3, 0, 1}));
  EXPECT_EQ(Values(second.mb.whole_positions), packed);
  EXPECT_EQ(second.mb.whole_positions.shape(), (Shape{2, 8}));
  EXPECT_THROW(ContextMicroBatch(whole, 0, 3), Error);
}

TEST(ContextParallelTest, UlyssesGroupsQueryHeadsAndTheKeyValueHeadsTheyRead) {
  const kernels::AttentionHeads heads{4, 2, 2};  // q 8 columns, k 4, v 4
  const UlyssesHeads two(heads, 2);
  EXPECT_EQ(two.group().num_heads, 2);
  EXPECT_EQ(two.group().num_kv_heads, 1);
  EXPECT_EQ(two.Columns(1, true),
            (std::vector<HeadColumns>{{4, 0, 4}, {8 + 2, 4, 2}, {12 + 2, 6, 2}}));
  EXPECT_EQ(two.Columns(1, false), (std::vector<HeadColumns>{{4, 0, 4}}));
  // Four ranks over two key/value heads: ranks 0 and 1 share head 0, ranks 2 and 3 head 1.
  const UlyssesHeads four(heads, 4);
  EXPECT_EQ(four.group().num_heads, 1);
  EXPECT_EQ(four.group().num_kv_heads, 1);
  EXPECT_EQ(four.Columns(1, true), (std::vector<HeadColumns>{{2, 0, 2}, {8, 2, 2}, {12, 4, 2}}));
  EXPECT_EQ(four.Columns(2, true), (std::vector<HeadColumns>{{4, 0, 2}, {10, 2, 2}, {14, 4, 2}}));
  EXPECT_THROW(UlyssesHeads(heads, 3), ConfigError);
  EXPECT_THROW(UlyssesHeads(kernels::AttentionHeads{6, 3, 2}, 2), ConfigError);
}

// P ranks as P threads: AllToAll hands chunk j of rank i's `in` to chunk i of rank j's `out`.
class ThreadGroup final : public ContextGroup {
 public:
  struct Shared {
    explicit Shared(int p) : ins(static_cast<size_t>(p)), sync(p) {}
    std::vector<Tensor> ins;
    std::barrier<> sync;
  };
  ThreadGroup(Shared& shared, int rank, ContextAlgorithm algorithm = ContextAlgorithm::kUlysses)
      : ContextGroup(algorithm), shared_(shared), rank_(rank) {}
  int size() const override { return static_cast<int>(shared_.ins.size()); }
  int rank() const override { return rank_; }
  // Synchronous: every rank's `send` lands in the next rank's `recv` before any returns.
  std::function<void()> StartShift(const Tensor& send, const Tensor& recv) const override {
    shared_.ins[static_cast<size_t>(rank_)] = send;
    shared_.sync.arrive_and_wait();
    const Tensor& from = shared_.ins[static_cast<size_t>((rank_ + size() - 1) % size())];
    std::memcpy(recv.data(), from.data(), from.nbytes());
    shared_.sync.arrive_and_wait();
    return [] {};
  }
  void AllToAll(const Tensor& in, const Tensor& out) const override {
    shared_.ins[static_cast<size_t>(rank_)] = in;
    shared_.sync.arrive_and_wait();
    const int64_t chunk = in.numel() / size();
    for (int i = 0; i < size(); ++i) {
      const float* src = shared_.ins[static_cast<size_t>(i)].data<float>() + rank_ * chunk;
      std::copy(src, src + chunk, out.data<float>() + i * chunk);
    }
    shared_.sync.arrive_and_wait();
  }

 private:
  Shared& shared_;
  int rank_;
};

// Each rank's piece of a whole [B, T, W] q/k/v goes to the head groups: rank j then holds the
// whole sequence's columns of its group, in the group's order; back again, q comes home as it
// left, and a key/value column shared by two groups comes home twice (summed).
TEST(ContextParallelTest, ExchangesMoveThePiecesToTheHeadGroupsAndBack) {
  const kernels::AttentionHeads heads{4, 2, 2};
  for (const int p : {2, 4}) {
    const int64_t batch = 2, seq = 8, piece = seq / p, width = heads.qkv_width();
    std::vector<float> whole(static_cast<size_t>(batch * seq * width));
    std::iota(whole.begin(), whole.end(), 1.0f);
    const UlyssesHeads ulysses(heads, p);
    const kernels::AttentionHeads& g = ulysses.group();
    ThreadGroup::Shared shared(p);
    std::vector<std::string> failures(static_cast<size_t>(p));
    std::vector<std::thread> ranks;
    for (int r = 0; r < p; ++r) {
      ranks.emplace_back([&, r] {
        auto ops = kernels::MakeCpuOps();
        MemoryTracker tracker;
        HostAllocator allocator(&tracker);
        LayerContext ctx(*ops, allocator);
        const ThreadGroup group(shared, r);
        std::vector<float> local(static_cast<size_t>(batch * piece * width));
        for (int64_t b = 0; b < batch; ++b) {
          const float* row = whole.data() + (b * seq + r * piece) * width;
          std::copy(row, row + piece * width, local.data() + b * piece * width);
        }
        const Tensor local_t(local.data(), DType::kF32, {batch * piece, width});
        const Tensor heads_t = ctx.Scratch(DType::kF32, {batch * seq, g.qkv_width()});
        group.SequenceToHeads(ctx, ulysses, true, batch, local_t, heads_t);
        for (const HeadColumns& c : ulysses.Columns(r, true)) {
          for (int64_t n = 0; n < batch * seq; ++n) {
            for (int64_t k = 0; k < c.width; ++k) {
              const float want = whole[static_cast<size_t>(n * width + c.local + k)];
              if (heads_t.data<float>()[n * g.qkv_width() + c.group + k] != want) {
                failures[static_cast<size_t>(r)] = "SequenceToHeads row " + std::to_string(n);
              }
            }
          }
        }
        const Tensor back = ctx.Scratch(DType::kF32, {batch * piece, width});
        group.HeadsToSequence(ctx, ulysses, true, batch, heads_t, back);
        // Each key/value head serves p / NKV groups when p > NKV, one otherwise.
        const float copies =
            p > heads.num_kv_heads ? static_cast<float>(p / heads.num_kv_heads) : 1.0f;
        for (int64_t n = 0; n < batch * piece; ++n) {
          for (int64_t k = 0; k < width; ++k) {
            const float factor = k < heads.q_width() ? 1.0f : copies;
            if (back.data<float>()[n * width + k] !=
                factor * local[static_cast<size_t>(n * width + k)]) {
              failures[static_cast<size_t>(r)] =
                  "HeadsToSequence element " + std::to_string(n) + "," + std::to_string(k);
            }
          }
        }
        ctx.Release();
      });
    }
    for (std::thread& t : ranks) t.join();
    for (int r = 0; r < p; ++r)
      EXPECT_EQ(failures[static_cast<size_t>(r)], "") << "P " << p << " rank " << r;
  }
}

// Ring attention (Note [Ring attention]) over P threads against the single-process kernel on the
// whole sequence: each rank's zigzag rows of the output, and of dq/dk/dv after the backward,
// equal the whole call's within fp32 rounding (the merges and the sums over the ring reorder
// the additions), for multi-head and grouped heads, causal, a window, and packed documents.
TEST(ContextParallelTest, RingAttentionMatchesTheWholeSequence) {
  struct Case {
    kernels::AttentionHeads heads;
    int p;
    int64_t window;
    bool packed;
  };
  for (const Case& k :
       {Case{{4, 4, 8}, 2, 0, false}, Case{{4, 2, 8}, 4, 0, false}, Case{{4, 1, 8}, 2, 0, true},
        Case{{2, 2, 8}, 2, 5, false}, Case{{4, 2, 8}, 4, 9, true}}) {
    const int p = k.p;
    const int64_t batch = 2, seq = 16 * p, width = k.heads.qkv_width(), qw = k.heads.q_width();
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> qkv(static_cast<size_t>(batch * seq * width)), dout(batch * seq * qw);
    for (float& x : qkv) x = normal(rng);
    for (float& x : dout) x = normal(rng);
    std::vector<int32_t> positions(static_cast<size_t>(batch * seq));
    for (int64_t b = 0; b < batch; ++b) {  // documents of 5, 11, 7, ... tokens
      int32_t at = 0, len = 5;
      for (int64_t t = 0; t < seq; ++t) {
        if (at == len) at = 0, len = len == 5 ? 11 : len == 11 ? 7 : 5;
        positions[static_cast<size_t>(b * seq + t)] = at++;
      }
    }
    auto ops = kernels::MakeCpuOps();
    const Tensor whole_pos(positions.data(), DType::kI32, {batch, seq});
    const kernels::AttentionMask mask{.window = k.window,
                                      .positions = k.packed ? whole_pos : Tensor()};
    std::vector<float> out(batch * seq * qw), lse(batch * k.heads.num_heads * seq),
        dqkv(qkv.size());
    const Tensor qkv_t(qkv.data(), DType::kF32, {batch, seq, width});
    const Tensor out_t(out.data(), DType::kF32, {batch, seq, qw});
    const Tensor lse_t(lse.data(), DType::kF32, {batch, k.heads.num_heads, seq});
    ops->AttentionForward(qkv_t, k.heads, mask, out_t, lse_t);
    ops->AttentionBackward(Tensor(dout.data(), DType::kF32, {batch, seq, qw}), qkv_t, out_t, lse_t,
                           k.heads, mask, Tensor(dqkv.data(), DType::kF32, {batch, seq, width}));
    // The rows rank r keeps: chunks r and 2P-1-r of c tokens.
    const int64_t c = seq / (2 * p), piece = 2 * c;
    const auto whole_row = [&](int r, int64_t b, int64_t i) {
      const int64_t chunk = i < c ? r : 2 * p - 1 - r;
      return b * seq + chunk * c + i % c;
    };
    ThreadGroup::Shared shared(p);
    std::vector<std::string> failures(static_cast<size_t>(p));
    std::vector<std::thread> ranks;
    for (int r = 0; r < p; ++r) {
      ranks.emplace_back([&, r] {
        auto rank_ops = kernels::MakeCpuOps();
        MemoryTracker tracker;
        HostAllocator allocator(&tracker);
        LayerContext ctx(*rank_ops, allocator);
        const ThreadGroup group(shared, r, nn::ContextAlgorithm::kRing);
        std::vector<float> local(batch * piece * width), local_dout(batch * piece * qw);
        std::vector<int32_t> local_pos(batch * piece);
        for (int64_t b = 0; b < batch; ++b) {
          for (int64_t i = 0; i < piece; ++i) {
            const int64_t w = whole_row(r, b, i), l = b * piece + i;
            std::copy_n(qkv.data() + w * width, width, local.data() + l * width);
            std::copy_n(dout.data() + w * qw, qw, local_dout.data() + l * qw);
            local_pos[static_cast<size_t>(l)] = positions[static_cast<size_t>(w)];
          }
        }
        const Tensor pos =
            k.packed ? Tensor(local_pos.data(), DType::kI32, {batch, piece}) : Tensor();
        const Tensor l_qkv(local.data(), DType::kF32, {batch * piece, width});
        const Tensor l_out = ctx.Scratch(DType::kF32, {batch * piece, qw});
        const Tensor l_lse = ctx.Scratch(DType::kF32, {batch * k.heads.num_heads * piece});
        group.RingForward(ctx, k.heads, k.window, pos, batch, l_qkv, l_out, l_lse);
        const Tensor l_dqkv = ctx.Scratch(DType::kF32, {batch * piece, width});
        group.RingBackward(ctx, k.heads, k.window, pos, batch,
                           Tensor(local_dout.data(), DType::kF32, {batch * piece, qw}), l_qkv,
                           l_out, l_lse, l_dqkv);
        double worst = 0.0;
        for (int64_t b = 0; b < batch; ++b) {
          for (int64_t i = 0; i < piece; ++i) {
            const int64_t w = whole_row(r, b, i), l = b * piece + i;
            for (int64_t x = 0; x < qw; ++x) {
              worst = std::max<double>(worst, std::abs(l_out.data<float>()[l * qw + x] -
                                                       out[static_cast<size_t>(w * qw + x)]));
            }
            for (int64_t x = 0; x < width; ++x) {
              worst = std::max<double>(worst, std::abs(l_dqkv.data<float>()[l * width + x] -
                                                       dqkv[static_cast<size_t>(w * width + x)]));
            }
          }
        }
        // Values of order 1 through a few dozen fp32 additions: 1e-5 is rounding, a wrong
        // mask or a lost block is order 0.1.
        if (!(worst < 1e-5))
          failures[static_cast<size_t>(r)] = "max |diff| " + std::to_string(worst);
        ctx.Release();
      });
    }
    for (std::thread& t : ranks) t.join();
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(failures[static_cast<size_t>(r)], "")
          << "P " << p << " heads " << k.heads.num_heads << "/" << k.heads.num_kv_heads
          << " window " << k.window << " packed " << k.packed << " rank " << r;
    }
  }
}

TEST(ContextParallelTest, RingPiecesAreZigzagChunks) {
  std::vector<int32_t> tokens(16), targets(16);
  std::iota(tokens.begin(), tokens.end(), 0);
  std::iota(targets.begin(), targets.end(), 100);
  const MicroBatch whole{Tensor(tokens.data(), DType::kI32, {1, 16}),
                         Tensor(targets.data(), DType::kI32, {1, 16})};
  // P = 2: 4 chunks of 4; rank 0 keeps chunks 0 and 3, rank 1 chunks 1 and 2.
  const ContextMicroBatch r0(whole, 0, 2, ContextAlgorithm::kRing);
  const ContextMicroBatch r1(whole, 1, 2, ContextAlgorithm::kRing);
  EXPECT_EQ(Values(r0.mb.tokens), (std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(Values(r1.mb.positions), (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(Values(r1.mb.targets), (std::vector<int32_t>{104, 105, 106, 107, 108, 109, 110, 111}));
  EXPECT_THROW(ContextMicroBatch(whole, 0, 3, ContextAlgorithm::kRing), Error);
  EXPECT_EQ(ParseContextAlgorithm("ring"), ContextAlgorithm::kRing);
  EXPECT_THROW(ParseContextAlgorithm("p2p"), ConfigError);
}

}  // namespace
}  // namespace ztrain::nn
