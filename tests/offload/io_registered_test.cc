// Registered (fixed) buffers on the io_uring engine: pieces inside a registered IoBuffer go
// out as READ_FIXED/WRITE_FIXED and come back byte for byte, other buffers stay plain, slots
// are reused after Reset, and a locked-memory limit too small for the pages leaves buffers
// unregistered but working.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "offload/io/io_options.h"
#include "tests/offload/io_test_util.h"

namespace ztrain::offload {
namespace {

using test_util::Buffers;
using test_util::RandomBytes;
using test_util::SameBytes;
using test_util::TempDir;

IoOptions SmallPieces() {
  IoOptions o;
  o.block_size = 64 << 10;
  o.queue_depth = 4;
  return o;
}

// An io_uring engine that can register buffers, or a skip saying why this machine has none.
#define MAKE_REGISTERING_ENGINE_OR_SKIP(engine)                                          \
  std::unique_ptr<IoEngine> engine = IoEngine::Make(SmallPieces());                      \
  if (!engine->uses_io_uring()) GTEST_SKIP() << "no io_uring here: " << engine->backend(); \
  if (engine->fixed_buffers().rfind("registered", 0) != 0)                               \
    GTEST_SKIP() << "this kernel cannot register buffers: " << engine->fixed_buffers();

TEST(IoRegisteredBufferTest, FixedPiecesRoundTripAndPlainBuffersStayPlain) {
  MAKE_REGISTERING_ENGINE_OR_SKIP(engine);
  TempDir dir;
  Buffers buffers;
  const int64_t bytes = (1 << 20) + 4097;  // 17 pieces of 64 KiB, the last one short
  const int64_t pieces = (AlignUp(bytes) + (64 << 10) - 1) / (64 << 10);
  auto file = SwapFile::Create(*engine, dir.File("fixed.swap"), 2 * AlignUp(bytes));
  const std::vector<char> a = RandomBytes(bytes, 1), b = RandomBytes(bytes, 2);

  IoBuffer registered = buffers.With(a);
  ASSERT_TRUE(registered.Register(*engine)) << engine->fixed_buffers();
  IoBuffer plain = buffers.With(b);
  file->Write(0, registered, bytes)->Wait();
  file->Write(AlignUp(bytes), plain, bytes)->Wait();
  EXPECT_EQ(engine->stats().fixed_pieces, pieces);

  // Read each record into the other buffer: fixed reads land in the registered one.
  file->Read(AlignUp(bytes), registered, bytes)->Wait();
  file->Read(0, plain, bytes)->Wait();
  EXPECT_TRUE(SameBytes(registered, b));
  EXPECT_TRUE(SameBytes(plain, a));
  const IoStats stats = engine->stats();
  EXPECT_EQ(stats.fixed_pieces, 2 * pieces);
  EXPECT_EQ(stats.pieces, 4 * pieces);
  EXPECT_EQ(stats.failures, 0);

  // After Reset the memory is no longer registered; a new buffer is plain until registered.
  registered.Reset();
  EXPECT_FALSE(registered.registered());
  IoBuffer again = buffers.Make(bytes);
  file->Read(0, again, bytes)->Wait();
  EXPECT_EQ(engine->stats().fixed_pieces, 2 * pieces);
  EXPECT_TRUE(SameBytes(again, a));
}

TEST(IoRegisteredBufferTest, SlotsRunOutAndAreReusedAfterReset) {
  MAKE_REGISTERING_ENGINE_OR_SKIP(engine);
  Buffers buffers;
  std::vector<IoBuffer> held;
  while (true) {
    held.push_back(buffers.Make(4096));
    if (!held.back().Register(*engine)) break;
    ASSERT_LE(held.size(), 1000u) << "registration never runs out of slots";
  }
  const size_t slots = held.size() - 1;
  EXPECT_NE(engine->fixed_buffers().find(std::to_string(slots) + " slots"), std::string::npos)
      << engine->fixed_buffers();
  EXPECT_FALSE(held.back().registered());
  held[3].Reset();  // frees one slot
  EXPECT_TRUE(held.back().Register(*engine));
  // A moved buffer keeps its registration and still works.
  TempDir dir;
  auto file = SwapFile::Create(*engine, dir.File("moved.swap"), 4096);
  const std::vector<char> data = RandomBytes(4096, 3);
  IoBuffer moved = std::move(held[5]);
  std::memcpy(moved.data(), data.data(), data.size());
  EXPECT_TRUE(moved.registered());
  file->Write(0, moved, 4096)->Wait();
  IoBuffer back = buffers.Make(4096);
  file->Read(0, back, 4096)->Wait();
  EXPECT_TRUE(SameBytes(back, data));
  EXPECT_EQ(engine->stats().fixed_pieces, 1);
}

TEST(IoRegisteredBufferTest, FallbackEngineKeepsBuffersPlain) {
  IoOptions o = SmallPieces();
  o.force_fallback = true;
  std::unique_ptr<IoEngine> engine = IoEngine::Make(o);
  Buffers buffers;
  IoBuffer b = buffers.Make(8192);
  EXPECT_FALSE(b.Register(*engine));
  EXPECT_EQ(engine->fixed_buffers().rfind("plain buffers", 0), 0u) << engine->fixed_buffers();
}

// Runs in a child process: a locked-memory limit of 64 KiB, and no CAP_IPC_LOCK (root becomes
// nobody), so a 1 MiB buffer cannot be pinned for the ring. It must stay plain and round-trip.
// Returns the exit code: 0 when it does (or when there is no io_uring to register with).
int RoundTripUnderSmallMemlock(const std::string& path) {
  const rlimit small{64 << 10, 64 << 10};
  if (setrlimit(RLIMIT_MEMLOCK, &small) != 0) return 2;
  if (geteuid() == 0 && setuid(65534) != 0) return 3;
  std::unique_ptr<IoEngine> engine = IoEngine::Make(SmallPieces());
  if (!engine->uses_io_uring()) return 0;
  Buffers buffers;
  const std::vector<char> data = RandomBytes(1 << 20, 4);
  IoBuffer b = buffers.With(data);
  if (b.Register(*engine)) return 4;
  auto file = SwapFile::Create(*engine, path, 1 << 20);
  file->Write(0, b, 1 << 20)->Wait();
  IoBuffer back = buffers.Make(1 << 20);
  file->Read(0, back, 1 << 20)->Wait();
  return SameBytes(back, data) && engine->stats().fixed_pieces == 0 ? 0 : 5;
}

TEST(IoRegisteredBufferDeathTest, LockedMemoryLimitLeavesBuffersPlainButWorking) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0777), 0);
  const std::string path = dir.File("limited.swap");
  EXPECT_EXIT(std::_Exit(RoundTripUnderSmallMemlock(path)), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace ztrain::offload
