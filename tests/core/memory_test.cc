#include <gtest/gtest.h>

#include "core/buffer.h"
#include "core/caching_allocator.h"
#include "core/memory_tracker.h"
#include "core/tensor.h"

namespace ztrain {
namespace {

TEST(MemoryTrackerTest, CountsCurrentAndPeakPerCategory) {
  MemoryTracker tracker;
  HostAllocator alloc(&tracker);
  {
    Buffer p(alloc, DType::kF32, {1000}, MemoryCategory::kParameters);
    Buffer a(alloc, 4096, MemoryCategory::kActivations);
    EXPECT_EQ(tracker.Current(MemoryCategory::kParameters), 4000);
    EXPECT_EQ(tracker.Current(MemoryCategory::kActivations), 4096);
    EXPECT_EQ(tracker.TotalCurrent(), 8096);
    Buffer moved = std::move(a);
    EXPECT_EQ(tracker.TotalCurrent(), 8096);
  }
  EXPECT_EQ(tracker.TotalCurrent(), 0);
  EXPECT_EQ(tracker.Peak(MemoryCategory::kParameters), 4000);
  EXPECT_EQ(tracker.TotalPeak(), 8096);
  Buffer g(alloc, 100, MemoryCategory::kGradients);
  tracker.ResetPeaks();
  EXPECT_EQ(tracker.TotalPeak(), 100);
  EXPECT_EQ(tracker.Peak(MemoryCategory::kParameters), 0);
}

// A tracker with a parent passes every allocation on: trackers per place add up into one for
// all memory, whose peak is the peak of the sum.
TEST(MemoryTrackerTest, ChildrenAddUpIntoTheirParent) {
  MemoryTracker all;
  MemoryTracker device(&all), host(&all);
  MemoryTracker pinned(&host);
  HostAllocator on_device(&device), on_host(&host), locked(&pinned);
  {
    Buffer a(on_device, 1000, MemoryCategory::kActivations);
    Buffer b(on_host, 300, MemoryCategory::kOptimizerState);
    Buffer c(locked, 200, MemoryCategory::kSwapBuffers);
    EXPECT_EQ(all.TotalCurrent(), 1500);
    EXPECT_EQ(host.TotalCurrent(), 500);
    EXPECT_EQ(host.Current(MemoryCategory::kSwapBuffers), 200);
    EXPECT_EQ(pinned.TotalCurrent(), 200);
    EXPECT_EQ(device.TotalCurrent(), 1000);
  }
  { Buffer d(on_device, 1400, MemoryCategory::kActivations); }
  EXPECT_EQ(all.TotalCurrent(), 0);
  EXPECT_EQ(all.TotalPeak(), 1500);
  EXPECT_EQ(device.TotalPeak(), 1400);
  EXPECT_EQ(all.Peak(MemoryCategory::kActivations), 1400);
  host.ResetPeaks();  // its own peaks only
  EXPECT_EQ(host.TotalPeak(), 0);
  EXPECT_EQ(all.TotalPeak(), 1500);
}

TEST(MemoryTrackerTest, TotalPeakIsNotSumOfCategoryPeaks) {
  MemoryTracker tracker;
  HostAllocator alloc(&tracker);
  { Buffer a(alloc, 1000, MemoryCategory::kActivations); }
  { Buffer w(alloc, 500, MemoryCategory::kWorkspace); }
  EXPECT_EQ(tracker.TotalPeak(), 1000);
  EXPECT_EQ(tracker.Snapshot().Peak(MemoryCategory::kWorkspace), 500);
}

TEST(CachingAllocatorTest, ReusesBlocksAndCountsOnlyBytesInUse) {
  MemoryTracker tracker;
  HostAllocator raw(nullptr);
  CachingAllocator cache(raw, &tracker);
  void* first;
  {
    Buffer a(cache, 1 << 20, MemoryCategory::kActivations);
    first = a.data();
    EXPECT_EQ(tracker.Current(MemoryCategory::kActivations), 1 << 20);
  }
  EXPECT_EQ(tracker.Current(MemoryCategory::kActivations), 0);
  EXPECT_EQ(cache.reserved(), size_t{1} << 20);
  Buffer b(cache, 1 << 20, MemoryCategory::kWorkspace);
  EXPECT_EQ(b.data(), first);  // same size: the cached block comes back
  EXPECT_EQ(tracker.Current(MemoryCategory::kWorkspace), 1 << 20);
  Buffer c(cache, 1 << 19, MemoryCategory::kWorkspace);
  EXPECT_NE(c.data(), first);
  EXPECT_EQ(cache.reserved(), (size_t{1} << 20) + (size_t{1} << 19));
}

TEST(CachingAllocatorTest, RefusesATrackedUpstream) {
  MemoryTracker tracker;
  HostAllocator tracked(&tracker);
  CachingAllocator cache(tracked, &tracker);
  EXPECT_THROW(Buffer(cache, 64, MemoryCategory::kWorkspace), InternalError);
}

TEST(TensorTest, ViewsSliceAndCheck) {
  float data[24];
  for (int i = 0; i < 24; ++i) data[i] = static_cast<float>(i);
  Tensor t(data, DType::kF32, {4, 6});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  Tensor s = t.Slice(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 6}));
  EXPECT_EQ(s.data<float>()[0], 6.0f);
  EXPECT_EQ(t.Flat(5, {3}).data<float>()[2], 7.0f);
  EXPECT_EQ(t.View({2, 12}).size(-1), 12);
  EXPECT_THROW(t.View({5, 5}), InternalError);
  EXPECT_THROW(CheckTensor(t, DType::kF32, {6, 4}, "x"), Error);
  EXPECT_NO_THROW(CheckTensor(t, DType::kF32, {4, 6}, "x"));
  EXPECT_FALSE(Tensor().defined());
}

TEST(ErrorTest, ChecksThrowWithTheirMessage) {
  try {
    ZTRAIN_CHECK(1 + 1 == 3, "arithmetic is off by ", 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "arithmetic is off by 1");
  }
  EXPECT_THROW(ZTRAIN_ASSERT(false), InternalError);
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
}

}  // namespace
}  // namespace ztrain
