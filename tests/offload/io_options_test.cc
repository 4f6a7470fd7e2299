// IoOptions from the aio section, the engine's option checks, and IoBuffer.
#include "offload/io/io_options.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>
#include <utility>

#include "core/config.h"
#include "tests/offload/io_test_util.h"

namespace ztrain::offload {
namespace {

TEST(IoOptionsTest, FromAioConfigKeepsDeepSpeedMeaning) {
  AioConfig aio;
  aio.block_size = 262144;
  aio.queue_depth = 16;
  aio.intra_op_parallelism = 4;
  aio.single_submit = true;
  aio.overlap_events = false;
  const IoOptions o = IoOptionsFrom(aio);
  EXPECT_EQ(o.block_size, 262144);
  EXPECT_EQ(o.queue_depth, 16);
  EXPECT_EQ(o.threads, 4);
  EXPECT_TRUE(o.single_submit);
  EXPECT_FALSE(o.overlap_events);
  EXPECT_FALSE(o.force_fallback);
  EXPECT_TRUE(o.direct);
}

TEST(IoOptionsTest, ThreadCountFromAConfigBecomesThreads) {
  const Config c = ParseConfig(nlohmann::json::parse(
      R"({"train_micro_batch_size_per_gpu": 1, "aio": {"thread_count": 3}})"));
  EXPECT_EQ(IoOptionsFrom(c.aio).threads, 3);
  const Config d = ParseConfig(nlohmann::json::parse(
      R"({"train_micro_batch_size_per_gpu": 1,
          "aio": {"thread_count": 3, "intra_op_parallelism": 2}})"));
  EXPECT_EQ(IoOptionsFrom(d.aio).threads, 2);
}

TEST(IoEngineTest, RejectsOptionsItCannotRun) {
  auto error_of = [](IoOptions o) -> std::string {
    try {
      IoEngine::Make(o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  IoOptions o;
  o.block_size = 1000;
  EXPECT_NE(error_of(o).find("aio.block_size must be a multiple of 4096"), std::string::npos);
  o = IoOptions{};
  o.queue_depth = 0;
  EXPECT_NE(error_of(o).find("aio.queue_depth"), std::string::npos);
  o = IoOptions{};
  o.threads = 0;
  o.force_fallback = true;
  EXPECT_NE(error_of(o).find("aio.intra_op_parallelism"), std::string::npos);
}

TEST(IoBufferTest, RoundsCapacityAndCountsSwapBuffers) {
  MemoryTracker tracker;
  HostAllocator allocator(&tracker);
  IoBuffer b(allocator, 5000);
  EXPECT_EQ(b.size(), 5000);
  EXPECT_EQ(b.capacity(), 8192);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kIoAlignment, 0u);
  EXPECT_EQ(tracker.Current(MemoryCategory::kSwapBuffers), 8192);
  for (int64_t i = 5000; i < 8192; ++i) ASSERT_EQ(b.data()[i], 0) << "padding byte " << i;
  rlimit memlock{};
  getrlimit(RLIMIT_MEMLOCK, &memlock);
  if (memlock.rlim_cur == RLIM_INFINITY || memlock.rlim_cur >= (1 << 20)) {
    EXPECT_TRUE(b.pinned()) << "RLIMIT_MEMLOCK " << memlock.rlim_cur << " allows 8 KiB";
  }
  IoBuffer moved = std::move(b);
  EXPECT_EQ(b.capacity(), 0);
  EXPECT_EQ(moved.capacity(), 8192);
  EXPECT_EQ(tracker.Current(MemoryCategory::kSwapBuffers), 8192);
  moved.Reset();
  EXPECT_EQ(tracker.Current(MemoryCategory::kSwapBuffers), 0);
  IoBuffer state(allocator, 1, MemoryCategory::kOptimizerState);
  EXPECT_EQ(tracker.Current(MemoryCategory::kOptimizerState), 4096);
}

}  // namespace
}  // namespace ztrain::offload
