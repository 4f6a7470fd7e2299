// The parameter and optimizer swappers against in-memory references: every value written
// comes back, in every pipelining and buffering variant, across many steps (the swap
// directory: swap_dir_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "core/memory_tracker.h"
#include "io_test_util.h"
#include "offload/io/io_engine.h"
#include "offload/optimizer_swapper.h"
#include "offload/param_swapper.h"

namespace ztrain::offload {
namespace {

using test_util::TempDir;

struct Env {
  MemoryTracker tracker;
  HostAllocator host{&tracker};
  std::unique_ptr<IoEngine> io;
  explicit Env(bool fallback) {
    IoOptions o;
    o.block_size = 8192;  // several pieces per record
    o.force_fallback = fallback;
    io = IoEngine::Make(o);
  }
};

class OptimizerSwapperTest : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

// Each step adds the step number to every m and v element; after several steps each element
// holds exactly what an in-memory array would.
TEST_P(OptimizerSwapperTest, TilesRoundTripAcrossSteps) {
  const auto [read_ahead, write_behind, fallback] = GetParam();
  Env env(fallback);
  TempDir dir;
  const int64_t elements = 10007;  // 4 tiles, the last one short
  OptimizerSwapper swap(
      env.io.get(), dir.File("opt.swp"), {elements},
      {.tile_elements = 3000, .pipeline_read = read_ahead, .pipeline_write = write_behind},
      env.host);
  EXPECT_EQ(swap.buffers(), 1 + read_ahead + write_behind);
  std::vector<float> m(elements, 0.0f), v(elements, 0.0f);
  for (int step = 1; step <= 4; ++step) {
    int64_t seen = 0;
    swap.ForEachTile([&](int64_t begin, int64_t count, float* tm, float* tv) {
      ASSERT_EQ(begin, seen);
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(tm[i], m[begin + i]) << "m[" << begin + i << "] at step " << step;
        ASSERT_EQ(tv[i], v[begin + i]) << "v[" << begin + i << "] at step " << step;
        tm[i] += static_cast<float>(step * (begin + i));
        tv[i] -= static_cast<float>(step);
        m[begin + i] = tm[i];
        v[begin + i] = tv[i];
      }
      seen += count;
    });
    ASSERT_EQ(seen, elements);
  }
  EXPECT_GT(env.tracker.Peak(MemoryCategory::kSwapBuffers), 0);
}

INSTANTIATE_TEST_SUITE_P(Pipelining, OptimizerSwapperTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Bool()));

// Layers of 2500, 0, 7000 and 100 elements in tiles of 3000: no tile crosses a layer, each
// record is as long as its tile, and walks of one layer (the deferred step), of all layers and
// prefetches in any order keep every element as an in-memory array would, through the
// buffers' cache and writes left in flight.
TEST_P(OptimizerSwapperTest, LayersWalkTheirOwnTilesInAnyOrder) {
  const auto [read_ahead, write_behind, fallback] = GetParam();
  Env env(fallback);
  TempDir dir;
  const std::vector<int64_t> layers = {2500, 0, 7000, 100};
  const std::vector<int64_t> first = {0, 2500, 2500, 9500};
  EXPECT_EQ(OptimizerSwapper::FileBytes(layers, 3000),
            2 * (AlignUp(2500 * 4) + 2 * AlignUp(3000 * 4) + AlignUp(1000 * 4) + AlignUp(100 * 4)));
  OptimizerSwapper swap(env.io.get(), dir.File("opt.swp"), layers,
                        {.tile_elements = 3000,
                         .pipeline_read = read_ahead,
                         .pipeline_write = write_behind,
                         .buffers = 3},
                        env.host);
  EXPECT_EQ(swap.buffers(), 3);
  EXPECT_EQ(swap.elements(), 9600);
  std::vector<float> m(9600, 0.0f), v(9600, 0.0f);
  std::mt19937 rng(7);
  int64_t stamp = 0;
  auto step = [&](int64_t begin, int64_t count, float* tm, float* tv) {
    ++stamp;
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(tm[i], m[begin + i]) << "m[" << begin + i << "]";
      ASSERT_EQ(tv[i], v[begin + i]) << "v[" << begin + i << "]";
      tm[i] = m[begin + i] = static_cast<float>(stamp * 10000 + i);
      tv[i] = v[begin + i] = static_cast<float>(-stamp);
    }
  };
  for (int round = 0; round < 40; ++round) {
    const int what = static_cast<int>(rng() % 5);
    const size_t l = rng() % layers.size();
    if (what == 0) {
      swap.ForEachTile(step);
    } else if (what == 1) {
      swap.Prefetch(l);
    } else if (what == 2) {
      swap.Flush();
    } else {
      // 3: a step of layer l; 4: a read of it (not saved), whose scribbles must not stay.
      std::vector<std::pair<int64_t, int64_t>> seen;
      const bool save = what == 3;
      swap.ForEachTileOf(
          l,
          [&](int64_t begin, int64_t count, float* tm, float* tv) {
            seen.emplace_back(begin, count);
            if (save) return step(begin, count, tm, tv);
            for (int64_t i = 0; i < count; ++i) {
              ASSERT_EQ(tm[i], m[begin + i]) << "m[" << begin + i << "]";
              tm[i] = tv[i] = 0.5f;
            }
          },
          save);
      int64_t at = first[l];
      for (const auto& [begin, count] : seen) {
        EXPECT_EQ(begin, at);
        EXPECT_LE(count, 3000);
        at += count;
      }
      EXPECT_EQ(at, first[l] + layers[l]);
    }
  }
  int64_t total = 0;
  swap.ForEachTile([&](int64_t begin, int64_t count, float* tm, float* tv) {
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(tm[i], m[begin + i]);
      ASSERT_EQ(tv[i], v[begin + i]);
    }
    total += count;
  });
  EXPECT_EQ(total, 9600);
}

TEST(OptimizerSwapperTest, AnErrorInTheStepLeavesTheFileConsistent) {
  Env env(false);
  TempDir dir;
  OptimizerSwapper swap(env.io.get(), dir.File("opt.swp"), {9000},
                        {.tile_elements = 3000, .pipeline_read = true, .pipeline_write = true},
                        env.host);
  swap.ForEachTile([](int64_t, int64_t count, float* m, float*) { std::fill(m, m + count, 1.0f); });
  // The second tile's step throws: tiles before it were written, the rest untouched.
  EXPECT_THROW(swap.ForEachTile([](int64_t begin, int64_t count, float* m, float*) {
    if (begin == 3000) throw Error("step failed");
    std::fill(m, m + count, 2.0f);
  }),
               Error);
  std::vector<float> firsts;
  swap.ForEachTile([&](int64_t, int64_t, float* m, float*) { firsts.push_back(m[0]); });
  EXPECT_EQ(firsts, (std::vector<float>{2.0f, 1.0f, 1.0f}));
}

class ParamSwapperTest : public ::testing::TestWithParam<std::tuple<int, int64_t, bool>> {};

// Random stores, prefetches, reads and in-place updates (Acquire / Release) against a
// reference: a read always returns the latest store, whether the layer is in memory, read
// ahead, evicted or being written.
TEST_P(ParamSwapperTest, ReadsReturnTheLatestStore) {
  const auto [buffer_count, max_in_cpu, fallback] = GetParam();
  Env env(fallback);
  TempDir dir;
  const std::vector<int64_t> shards = {1000, 3000, 17, 2500, 4096, 1};
  ParamSwapper swap(
      env.io.get(), dir.File("params.swp"), shards,
      {.buffer_count = buffer_count, .buffer_elements = 5000, .max_in_cpu = max_in_cpu}, env.host,
      env.host);
  std::vector<std::vector<float>> ref(shards.size());
  std::mt19937 rng(11);
  for (size_t l = 0; l < shards.size(); ++l) {
    ref[l].resize(shards[l]);
    for (float& x : ref[l]) x = static_cast<float>(rng() % 1000);
    swap.Store(l, ref[l].data());
  }
  std::vector<float> out;
  for (int op = 0; op < 400; ++op) {
    const size_t l = rng() % shards.size();
    switch (rng() % 5) {
      case 0:
        swap.Prefetch(l);
        break;
      case 1:
        out.assign(shards[l], -1.0f);
        swap.CopyOut(l, out.data());
        ASSERT_EQ(out, ref[l]) << "layer " << l << " at op " << op;
        break;
      case 2:
      case 3: {  // updated in place (the deferred optimizer step), or only looked at
        float* held = swap.Acquire(l);
        ASSERT_TRUE(std::equal(ref[l].begin(), ref[l].end(), held)) << "layer " << l;
        const bool change = rng() % 2 == 0;
        for (int64_t i = 0; i < shards[l]; ++i) {
          held[i] = change ? ref[l][i] = ref[l][i] * 2.0f + 1.0f : held[i];
        }
        swap.Release(l, change);
        break;
      }
      default:
        for (float& x : ref[l]) x += 1.0f;
        swap.Store(l, ref[l].data());
        break;
    }
  }
  swap.Flush();
  for (size_t l = 0; l < shards.size(); ++l) {
    out.assign(shards[l], -1.0f);
    swap.CopyOut(l, out.data());
    ASSERT_EQ(out, ref[l]) << "layer " << l;
  }
}

INSTANTIATE_TEST_SUITE_P(Buffers, ParamSwapperTest,
                         ::testing::Combine(::testing::Values(1, 2, 5),
                                            ::testing::Values<int64_t>(0, 4100),
                                            ::testing::Bool()));

TEST(ParamSwapperTest, MaxInCpuKeepsTheFirstLayersInMemory) {
  Env env(false);
  TempDir dir;
  ParamSwapper swap(env.io.get(), dir.File("params.swp"), {100, 200, 300},
                    {.buffer_count = 1, .buffer_elements = 1000, .max_in_cpu = 300}, env.host,
                    env.host);
  EXPECT_TRUE(swap.resident(0));
  EXPECT_TRUE(swap.resident(1));
  EXPECT_FALSE(swap.resident(2));
  EXPECT_EQ(swap.resident_elements(), 300);
  EXPECT_EQ(ParamSwapper::FileBytes({100, 200, 300}, 300), kIoAlignment);
}

TEST(ParamSwapperTest, AShardLargerThanTheBufferSizeNamesTheSizeNeeded) {
  Env env(false);
  TempDir dir;
  try {
    ParamSwapper swap(env.io.get(), dir.File("params.swp"), {100, 7000},
                      {.buffer_count = 2, .buffer_elements = 5000, .max_in_cpu = 0}, env.host,
                      env.host);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("set buffer_size to at least 7000"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ztrain::offload
