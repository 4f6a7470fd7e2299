// What a shape-only engine runs on (Note [Shape-only engine], estimate/shape_only.h): memory
// that is counted and holds no data, groups whose sends finish on the poll they were given,
// and the engine itself making no swap file, directory or value. That it allocates what the
// real engine allocates is estimate_test's and layout_equivalence_test's (every mode, every
// rank of the layouts).
#include "estimate/shape_only.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "core/buffer.h"
#include "core/caching_allocator.h"
#include "engine/engine.h"
#include "nn/family.h"
#include "tests/engine/test_model.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using detail::ShapeOnlyAllocator;
using detail::ShapeOnlyGroup;

TEST(ShapeOnlyAllocatorTest, CountsBlocksThatHoldNoData) {
  MemoryTracker tracker;
  ShapeOnlyAllocator memory(Device::Cuda(0), &tracker), host(Device::Cpu(), &tracker);
  EXPECT_FALSE(memory.holds_data());
  std::set<void*> seen;
  {
    // Larger than any machine: nothing is mapped, so nothing limits a block.
    Buffer huge(memory, size_t{1} << 55, MemoryCategory::kParameters);
    Buffer small(host, 10, MemoryCategory::kActivations);
    EXPECT_EQ(tracker.TotalCurrent(), (int64_t{1} << 55) + 10);
    EXPECT_EQ(huge.device(), Device::Cuda(0));
    EXPECT_FALSE(small.holds_data());
    small.Zero();  // nothing to zero, and no fault
    for (const Buffer* b : {&huge, &small}) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
      EXPECT_TRUE(seen.insert(b->data()).second) << "two live blocks at one address";
    }
  }
  EXPECT_EQ(tracker.TotalCurrent(), 0);
  EXPECT_EQ(tracker.Peak(MemoryCategory::kParameters), int64_t{1} << 55);
  // A caching allocator over it holds no data either.
  ShapeOnlyAllocator upstream(Device::Cpu(), nullptr);
  CachingAllocator cache(upstream, &tracker);
  EXPECT_FALSE(cache.holds_data());
}

TEST(ShapeOnlyAllocatorTest, RecordsAllocationsAndFreesInOrder) {
  std::vector<detail::AllocEvent> events;
  ShapeOnlyAllocator memory(Device::Cpu(), nullptr, ShapeOnlyAllocator::Backing::kMapped);
  memory.set_events(&events);
  {
    Buffer a(memory, 100, MemoryCategory::kActivations);
    static_cast<char*>(a.data())[99] = 1;  // mapped: a probe's host loop may write
    Buffer b(memory, 50, MemoryCategory::kWorkspace);
  }
  memory.set_events(nullptr);
  Buffer unrecorded(memory, 7, MemoryCategory::kWorkspace);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_FALSE(events[0].free);
  EXPECT_EQ(events[0].bytes, 100);
  EXPECT_EQ(events[1].category, MemoryCategory::kWorkspace);
  EXPECT_TRUE(events[2].free);
  EXPECT_EQ(events[2].id, events[1].id);  // b goes first
  EXPECT_EQ(events[3].id, events[0].id);
}

TEST(ShapeOnlyGroupTest, SendsFinishOnTheirPoll) {
  ShapeOnlyGroup pp(4, 2, {3, 0});
  EXPECT_EQ(pp.size(), 4);
  EXPECT_EQ(pp.rank(), 2);
  const Tensor none;
  const comm::WorkPtr first = pp.Send(none, 3, 0);
  const comm::WorkPtr second = pp.Send(none, 3, 1);
  const comm::WorkPtr third = pp.Send(none, 3, 2);  // past the list: done at once
  EXPECT_FALSE(first->Done());
  EXPECT_FALSE(first->Done());
  EXPECT_TRUE(first->Done());
  EXPECT_TRUE(first->Done());  // and stays done
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(second->Done());  // until waited for
  second->Wait();
  EXPECT_TRUE(second->Done());
  EXPECT_TRUE(third->Done());
  EXPECT_TRUE(pp.AllReduce(none, comm::ReduceOp::kSum)->Done());
  EXPECT_THROW(pp.Split(0, 0), InternalError);
}

// A shape-only engine with NVMe offload leaves nvme_path as it found it, and counts the swap
// files a real one makes.
TEST(ShapeOnlyEngineTest, MakesNoSwapFilesButCountsThem) {
  char tmpl[] = "/tmp/ztrain_shape_only_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  nlohmann::json j = testing::SmallConfigJson(2, 1);
  j["zero_optimization"] = {
      {"stage", 3},
      {"offload_param", {{"device", "nvme"}, {"nvme_path", dir}, {"max_in_cpu", 0}}},
      {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", dir}}}};
  const Config config = ParseConfig(j, 1);
  int64_t counted = 0;
  {
    ShapeOnlyGroup dp(1, 0), pp(1, 0), tp(1, 0);
    Engine shape(config, nn::BuildModel(config.model), {&dp, &pp, &tp},
                 Engine::ShapeOnly{Device::Cpu()});
    counted = shape.swap_file_bytes();
    EXPECT_TRUE(fs::is_empty(dir)) << "a shape-only engine made files under " << dir;
    EXPECT_GT(shape.memory().Peak(MemoryCategory::kSwapBuffers), 0);
  }
  int64_t made = 0;
  {
    Engine real(config, nn::BuildModel(config.model));
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      if (e.is_regular_file() && e.path().extension() == ".swp") made += e.file_size();
    }
    EXPECT_EQ(real.swap_file_bytes(), made);
  }
  EXPECT_GT(made, 0);
  EXPECT_EQ(counted, made);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ztrain
