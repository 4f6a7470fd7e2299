// Injected faults: a truncated swap file, a file-size limit (EFBIG), a full file system, calls
// that break the rules. Each must give an IoError naming the file, offset and size, and leave
// the rest of the file and the engine as they were.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/offload/io_test_util.h"

namespace ztrain::offload {
namespace {

using test_util::Buffers;
using test_util::EngineVariant;
using test_util::ExpectIoErrorWith;
using test_util::RandomBytes;
using test_util::SameBytes;
using test_util::TempDir;

bool SamePrefix(const IoBuffer& b, const std::vector<char>& expected, int64_t n) {
  return std::memcmp(b.data(), expected.data(), static_cast<size_t>(n)) == 0;
}

// Lowers RLIMIT_FSIZE (with SIGXFSZ ignored, writes past it fail with EFBIG); restores both at
// scope exit.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    rlimit r = old_;
    r.rlim_cur = bytes;
    ok_ = setrlimit(RLIMIT_FSIZE, &r) == 0;
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  sighandler_t old_handler_ = SIG_DFL;
  bool ok_ = false;
};

// A 1 MiB tmpfs mounted for the test and unmounted at scope exit. Mounting needs root (or
// CAP_SYS_ADMIN); elsewhere mounted() is false and why() says so.
class SmallTmpfs {
 public:
  SmallTmpfs() {
    mounted_ = mount("ztrain_test", dir_.path().c_str(), "tmpfs", 0, "size=1m") == 0;
    if (!mounted_) why_ = std::string("cannot mount a 1 MiB tmpfs: ") + std::strerror(errno);
  }
  ~SmallTmpfs() {
    if (mounted_) umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }
  std::string File(const std::string& name) const { return dir_.File(name); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string why_;
};

class IoFaultTest : public ::testing::TestWithParam<EngineVariant> {
 protected:
  const IoOptions& options() const { return GetParam().options; }
  TempDir dir_;
  Buffers buffers_;
};

TEST_P(IoFaultTest, TruncatedSwapFileIsAShortFileError) {
  ZTRAIN_MAKE_ENGINE_OR_SKIP(engine, options());
  constexpr int64_t kBytes = 1 << 20;
  const std::string path = dir_.File("truncated.swap");
  auto file = SwapFile::Create(*engine, path, kBytes);
  const std::vector<char> data = RandomBytes(kBytes, 1);
  IoBuffer out = buffers_.With(data);
  file->Write(0, out, kBytes)->Wait();
  ASSERT_EQ(truncate(path.c_str(), 300000), 0);
  IoBuffer in = buffers_.Make(kBytes);
  ExpectIoErrorWith([&] { file->Read(0, in, kBytes)->Wait(); },
                    {path, "short file", "expected 1048576 bytes at offset 0", "file has 300000"});
  ExpectIoErrorWith([&] { file->Read(0, in, 300001)->Wait(); },
                    {path, "expected 300001 bytes at offset 0", "file has 300000"});
  ExpectIoErrorWith([&] { file->Read(524288, in, 4096)->Wait(); },
                    {path, "read of 4096 bytes at offset 524288", "file has 300000"});
  // What the file still holds reads back unchanged, up to its last byte.
  file->Read(0, in, 300000)->Wait();
  EXPECT_TRUE(SamePrefix(in, data, 300000));
  EXPECT_EQ(engine->stats().failures, 3);
}

TEST_P(IoFaultTest, ExistingFileOfUnalignedSize) {
  ZTRAIN_MAKE_ENGINE_OR_SKIP(engine, options());
  const std::string path = dir_.File("checkpoint.bin");
  const std::vector<char> data = RandomBytes(5000, 2);
  std::ofstream(path, std::ios::binary).write(data.data(), 5000);
  auto file = SwapFile::Open(*engine, path);
  EXPECT_EQ(file->size(), 5000);
  IoBuffer in = buffers_.Make(8192);
  file->Read(0, in, 5000)->Wait();
  EXPECT_TRUE(SamePrefix(in, data, 5000));
  ExpectIoErrorWith([&] { file->Read(0, in, 5001)->Wait(); },
                    {path, "short file", "expected 5001 bytes at offset 0", "file has 5000"});
  // A write moves whole 4 KiB blocks, so it may not reach past the end of the file.
  ExpectIoErrorWith([&] { file->Write(0, in, 5000); },
                    {path, "5000 bytes at offset 0", "pass the end of the file (5000 bytes)"});
}

TEST_P(IoFaultTest, FileSizeLimitGivesNamedErrorAndKeepsEarlierData) {
  ZTRAIN_MAKE_ENGINE_OR_SKIP(engine, options());
  constexpr int64_t kBytes = 1 << 20;
  const std::string path = dir_.File("limited.swap");
  auto file = SwapFile::Create(*engine, path, kBytes);  // preallocated before the limit
  const std::vector<char> a = RandomBytes(256 << 10, 3);
  IoBuffer out_a = buffers_.With(a);
  file->Write(0, out_a, 256 << 10)->Wait();
  const std::vector<char> b = RandomBytes(64 << 10, 4);
  IoBuffer out_b = buffers_.With(b);
  {
    FileSizeLimit limit(496 << 10);
    ASSERT_TRUE(limit.ok()) << std::strerror(errno);
    ExpectIoErrorWith([&] { file->Write(512 << 10, out_b, 64 << 10)->Wait(); },
                      {path, "write of 65536 bytes at offset 524288", "EFBIG"});
    // One piece across the limit: the part below it is written, the rest is resubmitted and
    // fails, naming where.
    ExpectIoErrorWith([&] { file->Write(480 << 10, out_b, 64 << 10)->Wait(); },
                      {path, "write of 49152 bytes at offset 507904", "EFBIG",
                       "part of a 65536-byte write at offset 491520"});
  }
  EXPECT_GE(engine->stats().resubmits, 1);
  IoBuffer in = buffers_.Make(256 << 10);
  file->Read(0, in, 256 << 10)->Wait();
  EXPECT_TRUE(SameBytes(in, a));
  // The engine and the file still work once the limit is gone.
  file->Write(512 << 10, out_b, 64 << 10)->Wait();
  file->Read(512 << 10, in, 64 << 10)->Wait();
  EXPECT_TRUE(SamePrefix(in, b, 64 << 10));
}

TEST_P(IoFaultTest, FullFileSystemRefusesCreateAndLeavesNoFile) {
  SmallTmpfs fs;
  if (!fs.mounted()) GTEST_SKIP() << fs.why();
  ZTRAIN_MAKE_ENGINE_OR_SKIP(engine, options());
  const std::string path = fs.File("big.swap");
  ExpectIoErrorWith([&] { SwapFile::Create(*engine, path, 4 << 20); },
                    {path, "4194304 bytes (4.00 MiB) needed", "bytes free", "ENOSPC"});
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_P(IoFaultTest, FullFileSystemFailsAWriteAndKeepsOtherFiles) {
  SmallTmpfs fs;
  if (!fs.mounted()) GTEST_SKIP() << fs.why();
  ZTRAIN_MAKE_ENGINE_OR_SKIP(engine, options());
  auto small = SwapFile::Create(*engine, fs.File("small.swap"), 256 << 10);
  const std::vector<char> x = RandomBytes(256 << 10, 5);
  IoBuffer out_x = buffers_.With(x);
  small->Write(0, out_x, 256 << 10)->Wait();
  // A sparse file (not preallocated, e.g. made by another tool) runs out of space mid-write.
  const std::string sparse = fs.File("sparse.swap");
  std::ofstream(sparse).close();
  ASSERT_EQ(truncate(sparse.c_str(), 2 << 20), 0);
  auto file = SwapFile::Open(*engine, sparse);
  IoBuffer big = buffers_.With(RandomBytes(2 << 20, 6));
  ExpectIoErrorWith([&] { file->Write(0, big, 2 << 20)->Wait(); },
                    {sparse, "write of", "bytes at offset", "ENOSPC"});
  IoBuffer in = buffers_.Make(256 << 10);
  small->Read(0, in, 256 << 10)->Wait();
  EXPECT_TRUE(SameBytes(in, x));
}

INSTANTIATE_TEST_SUITE_P(Engines, IoFaultTest,
                         ::testing::Values(test_util::EngineVariants()[0],
                                           test_util::EngineVariants()[2]),
                         [](const auto& info) { return info.param.name; });

TEST(SwapFileTest, RejectsCallsThatBreakTheRules) {
  TempDir dir;
  Buffers buffers;
  auto engine = IoEngine::Make(IoOptions{});
  auto file = SwapFile::Create(*engine, dir.File("rules.swap"), 10000);
  EXPECT_EQ(file->size(), 12288);
  IoBuffer b = buffers.Make(5000);
  EXPECT_THROW(file->Read(100, b, 10), Error);      // offset not aligned
  EXPECT_THROW(file->Read(0, b, 8193), Error);      // more than the buffer holds
  EXPECT_THROW(file->Write(12288, b, 1), IoError);  // past the end of the file
  file->Write(8192, b, 4096)->Wait();               // the last block fits
  ExpectIoErrorWith([&] { SwapFile::Open(*engine, dir.File("missing.swap")); },
                    {dir.File("missing.swap"), "ENOENT"});
  ExpectIoErrorWith([&] { SwapFile::Create(*engine, dir.File("no/such/dir.swap"), 1); },
                    {"no/such/dir.swap", "ENOENT"});
}

TEST(SwapFileTest, FreeBytesMatchesStatvfsAndNamesAMissingPath) {
  TempDir dir;
  EXPECT_GT(FreeBytes(dir.path()), 0);
  ExpectIoErrorWith([&] { FreeBytes(dir.File("missing")); }, {dir.File("missing"), "ENOENT"});
}

}  // namespace
}  // namespace ztrain::offload
