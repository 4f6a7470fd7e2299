#pragma once
// Helpers for the offload I/O tests: a scratch directory, random bytes, the engine variants
// every round trip runs on, and an expectation on an IoError's message.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "core/memory_tracker.h"
#include "offload/io/io_buffer.h"
#include "offload/io/io_engine.h"
#include "offload/io/swap_file.h"
#include "tests/expect_error.h"
#include "tests/temp_dir.h"

namespace ztrain::offload::test_util {

// A fresh directory under $ZTRAIN_TEST_IO_DIR (default /tmp), removed with its contents.
class TempDir : public ztrain::testing::TempDir {
 public:
  explicit TempDir(const std::string& parent = "")
      : ztrain::testing::TempDir("ztrain_io_test", Base(parent)) {}

 private:
  static std::string Base(const std::string& parent) {
    const char* env = std::getenv("ZTRAIN_TEST_IO_DIR");
    return !parent.empty() ? parent : env ? env : "/tmp";
  }
};

inline std::vector<char> RandomBytes(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<char> v(static_cast<size_t>(n));
  for (char& c : v) c = static_cast<char>(rng() & 0xff);
  return v;
}

// An I/O buffer holding `bytes`, counted by the test's tracker.
struct Buffers {
  MemoryTracker tracker;
  HostAllocator allocator{&tracker};
  IoBuffer Make(int64_t bytes) { return IoBuffer(allocator, bytes); }
  IoBuffer With(const std::vector<char>& data) {
    IoBuffer b(allocator, static_cast<int64_t>(data.size()));
    std::memcpy(b.data(), data.data(), data.size());
    return b;
  }
};

inline bool SameBytes(const IoBuffer& b, const std::vector<char>& expected) {
  return std::memcmp(b.data(), expected.data(), expected.size()) == 0;
}

// A named engine configuration; the round trips run on each.
struct EngineVariant {
  std::string name;
  IoOptions options;
};

// Test names and failure messages show the variant's name, not its bytes.
inline void PrintTo(const EngineVariant& v, std::ostream* os) { *os << v.name; }

inline std::vector<EngineVariant> EngineVariants() {
  IoOptions small;  // small pieces, so that a few hundred KiB spans many of them
  small.block_size = 64 << 10;
  small.queue_depth = 4;
  std::vector<EngineVariant> v;
  v.push_back({"IoUring", small});
  IoOptions batched = small;
  batched.single_submit = true;
  batched.overlap_events = false;
  v.push_back({"IoUringSingleSubmitNoOverlap", batched});
  IoOptions fallback = small;
  fallback.force_fallback = true;
  v.push_back({"Fallback1Thread", fallback});
  fallback.threads = 3;
  v.push_back({"Fallback3Threads", fallback});
  return v;
}

// Makes the variant's engine; skips the test when it asks for io_uring and this machine or
// build has none (the backend string says why).
#define ZTRAIN_MAKE_ENGINE_OR_SKIP(engine, options)          \
  std::unique_ptr<::ztrain::offload::IoEngine> engine =      \
      ::ztrain::offload::IoEngine::Make(options);            \
  if (!(options).force_fallback && !engine->uses_io_uring()) \
    GTEST_SKIP() << "io_uring is not available here: " << engine->backend();

// Expects `f()` to throw IoError whose message contains every string in `parts`.
template <typename F>
void ExpectIoErrorWith(F&& f, const std::vector<std::string>& parts) {
  ztrain::testing::ExpectErrorWith<IoError>(std::forward<F>(f), parts);
}

}  // namespace ztrain::offload::test_util
