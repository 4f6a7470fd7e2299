// Note [Context parallelism] (nn/context_parallel.h): the pieces of a micro-batch, Ulysses' head
// groups, and its two exchanges over P ranks played by P threads with an in-process all-to-all
// (the real one is MPI's: layout_equivalence_test --cp).
#include "nn/context_parallel.h"

#include <gtest/gtest.h>

#include <barrier>
#include <numeric>
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
  ThreadGroup(Shared& shared, int rank) : shared_(shared), rank_(rank) {}
  int size() const override { return static_cast<int>(shared_.ins.size()); }
  int rank() const override { return rank_; }
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

}  // namespace
}  // namespace ztrain::nn
