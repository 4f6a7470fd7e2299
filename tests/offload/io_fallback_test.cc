// The fallbacks: io_uring refused by the kernel (a seccomp filter stands in for a container
// that forbids it, or a kernel without it) and O_DIRECT refused by the file system. Each must
// still move the bytes, name the reason in backend() or direct(), and say so once.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <spdlog/sinks/ostream_sink.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/logging.h"
#include "tests/offload/io_test_util.h"

namespace ztrain::offload {
namespace {

using test_util::Buffers;
using test_util::EngineVariant;
using test_util::RandomBytes;
using test_util::SameBytes;
using test_util::TempDir;

// Makes io_uring_setup fail with `err` in this process (seccomp filter; no privileges needed).
bool DenyIoUringSetup(int err) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K,
               SECCOMP_RET_ERRNO | (static_cast<uint32_t>(err) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// Captures what the "ztrain" logger writes from now on.
std::shared_ptr<std::ostringstream> CaptureLog() {
  auto out = std::make_shared<std::ostringstream>();
  Log().sinks().push_back(std::make_shared<spdlog::sinks::ostream_sink_mt>(*out));
  return out;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Round-trips awkward sizes through a fresh file in `dir`; returns "" or what went wrong.
std::string RoundTrip(IoEngine& engine, const std::string& dir, bool expect_direct) {
  Buffers buffers;
  auto file = SwapFile::Create(engine, dir + "/round_trip.swap", 1 << 20);
  if (file->direct() != expect_direct) return "direct() is " + std::to_string(file->direct());
  int64_t offset = 0;
  for (int64_t bytes : {int64_t{1}, int64_t{4097}, int64_t{300001}}) {
    const std::vector<char> data = RandomBytes(bytes, static_cast<uint64_t>(bytes));
    IoBuffer out = buffers.With(data);
    IoBuffer in = buffers.Make(bytes);
    file->Write(offset, out, bytes)->Wait();
    file->Read(offset, in, bytes)->Wait();
    if (!SameBytes(in, data)) return "bytes differ at size " + std::to_string(bytes);
    offset += AlignUp(bytes);
  }
  return "";
}

void ExpectFallbackWhenIoUringSetupFails(int err, const char* err_name) {
#if !ZTRAIN_TEST_HAVE_IO_URING
  GTEST_SKIP() << "this build has no io_uring (the fallback is the only backend)";
#endif
  if (prctl(PR_GET_SECCOMP, 0, 0, 0, 0) < 0) GTEST_SKIP() << "this kernel has no seccomp";
  TempDir dir;
  // In a forked child: the filter cannot be removed once installed.
  EXPECT_EXIT(
      {
        auto log = CaptureLog();
        if (!DenyIoUringSetup(err)) {
          std::fprintf(stderr, "seccomp: %s\n", std::strerror(errno));
          std::_Exit(3);
        }
        auto engine = IoEngine::Make(IoOptions{});
        auto second = IoEngine::Make(IoOptions{});
        const std::string backend = engine->backend();
        const std::string problem = RoundTrip(*engine, dir.path(), true);
        const int said = Count(log->str(), "io_uring unavailable");
        std::fprintf(stderr, "backend: %s\nround trip: %s\nsaid %d times\n", backend.c_str(),
                     problem.c_str(), said);
        const bool ok = !engine->uses_io_uring() &&
                        backend.find("pread/pwrite") != std::string::npos &&
                        backend.find(std::string("io_uring unavailable: ")) != std::string::npos &&
                        backend.find(err_name) != std::string::npos && problem.empty() && said == 1;
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(IoFallbackTest, IoUringRefusedWithEpermFallsBackAndSaysWhyOnce) {
  ExpectFallbackWhenIoUringSetupFails(EPERM, "(EPERM)");
}

TEST(IoFallbackTest, IoUringMissingWithEnosysFallsBackAndSaysWhyOnce) {
  ExpectFallbackWhenIoUringSetupFails(ENOSYS, "(ENOSYS)");
}

// A directory on a file system that refuses O_DIRECT: /dev/shm where it is a tmpfs without
// O_DIRECT (Linux < 6.6), else a ramfs mounted for the test (root only). Empty path() and
// why() when neither can be had.
class NoDirectDir {
 public:
  NoDirectDir() {
    if (RefusesDirect("/dev/shm")) {
      dir_ = std::make_unique<TempDir>("/dev/shm");
      return;
    }
    dir_ = std::make_unique<TempDir>();
    if (mount("ztrain_test", dir_->path().c_str(), "ramfs", 0, nullptr) == 0) {
      mounted_ = true;
      return;
    }
    why_ = std::string("/dev/shm takes O_DIRECT here and mounting a ramfs failed: ") +
           std::strerror(errno);
    dir_.reset();
  }
  ~NoDirectDir() {
    if (mounted_) umount2(dir_->path().c_str(), MNT_DETACH);
  }
  std::string path() const { return dir_ ? dir_->path() : ""; }
  const std::string& why() const { return why_; }

 private:
  static bool RefusesDirect(const std::string& dir) {
    const std::string probe = dir + "/ztrain_odirect_probe_" + std::to_string(getpid());
    const int fd = open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT, 0600);
    const bool refused = fd < 0 && errno == EINVAL;
    if (fd >= 0) close(fd);
    unlink(probe.c_str());
    return refused;
  }
  std::unique_ptr<TempDir> dir_;
  bool mounted_ = false;
  std::string why_;
};

class BufferedFallbackTest : public ::testing::TestWithParam<EngineVariant> {};

TEST_P(BufferedFallbackTest, RoundTripsWhenODirectIsRefused) {
  NoDirectDir dir;
  if (dir.path().empty()) GTEST_SKIP() << dir.why();
  ZTRAIN_MAKE_ENGINE_OR_SKIP(engine, GetParam().options);
  EXPECT_EQ(RoundTrip(*engine, dir.path(), false), "");
  auto reopened = SwapFile::Open(*engine, dir.path() + "/round_trip.swap");
  EXPECT_FALSE(reopened->direct());
}

INSTANTIATE_TEST_SUITE_P(Engines, BufferedFallbackTest,
                         ::testing::Values(test_util::EngineVariants()[0],
                                           test_util::EngineVariants()[2]),
                         [](const auto& info) { return info.param.name; });

TEST(IoFallbackTest, ODirectRefusalIsSaidOncePerProcess) {
  NoDirectDir dir;
  if (dir.path().empty()) GTEST_SKIP() << dir.why();
  EXPECT_EXIT(
      {
        auto log = CaptureLog();
        auto engine = IoEngine::Make(IoOptions{});
        for (int i = 0; i < 3; ++i) {
          SwapFile::Create(*engine, dir.path() + "/f" + std::to_string(i), 4096);
        }
        std::_Exit(Count(log->str(), "refuses O_DIRECT"));
      },
      ::testing::ExitedWithCode(1), "");
}

}  // namespace
}  // namespace ztrain::offload
