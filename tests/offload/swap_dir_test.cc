// The swap directory (Note [Stale swap directories]): the up-front space check and the
// clean-up; files that a killed run left are reclaimed and counted as free space; a
// directory that a live process holds, in this process or another, is refused with the
// holder's pid; a SIGKILLed holder leaves no lock behind; other ranks' stale directories are
// named with the command that removes them, never deleted. Free space is faked where a test
// needs it short.
#include "offload/swap_dir.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/logging.h"
#include "io_test_util.h"
#include "core/dir_lock.h"

namespace ztrain::offload {
namespace {

namespace fs = std::filesystem;
using test_util::ExpectIoErrorWith;
using test_util::TempDir;

constexpr int64_t kMiB = int64_t{1} << 20;

// Captures what the "ztrain" logger writes from now on.
std::shared_ptr<std::ostringstream> CaptureLog() {
  auto out = std::make_shared<std::ostringstream>();
  Log().sinks().push_back(std::make_shared<spdlog::sinks::ostream_sink_mt>(*out));
  return out;
}

FreeBytesFunction FakeFree(int64_t bytes) {
  return [bytes](const std::string&) { return bytes; };
}

// A file of `bytes` real (allocated) bytes.
void WriteFile(const std::string& path, int64_t bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  const std::string block(64 << 10, 'x');
  for (int64_t done = 0; done < bytes; done += static_cast<int64_t>(block.size())) {
    out.write(block.data(), static_cast<std::streamsize>(block.size()));
  }
}

// A lock file naming a process that no longer runs, as a SIGKILLed run leaves it.
void WriteDeadLock(const std::string& dir) {
  std::ofstream(dir + "/" + DirLock::kFileName)
      << "job=job\nhost=gone\npid=4000000\nsince=2025-01-01 00:00:00 UTC\n";
}

// A child process that makes rank `rank`'s SwapDir, writes `file` in it and waits to be
// killed; returns its pid once the directory is made.
pid_t StartHolder(const std::string& nvme, int rank, const std::string& file) {
  int ready[2];
  if (pipe(ready) != 0) ADD_FAILURE() << "pipe failed";
  const pid_t pid = fork();
  if (pid == 0) {
    close(ready[0]);
    char made = '0';
    try {
      SwapDir swap(nvme, "job", rank, 8, 1, "offload_param");
      WriteFile(swap.File(file), 256 << 10);
      made = '1';
      if (write(ready[1], &made, 1) != 1) _exit(1);
      for (;;) pause();
    } catch (...) {
      if (write(ready[1], &made, 1) != 1) _exit(1);
    }
    _exit(1);
  }
  close(ready[1]);
  char made = '0';
  EXPECT_EQ(read(ready[0], &made, 1), 1);
  close(ready[0]);
  EXPECT_EQ(made, '1') << "the child could not make its swap directory";
  return pid;
}

void Kill(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

TEST(SwapDirTest, ChecksTheSpaceUpFrontAndCleansUp) {
  TempDir dir;
  std::string path;
  {
    SwapDir swap(dir.path(), "job", 3, 4, 4096, "offload_param");
    path = swap.path();
    EXPECT_EQ(path, dir.path() + "/ztrain-job/rank3");
    EXPECT_TRUE(fs::is_directory(path));
    EXPECT_TRUE(DirLock::IsHeld(path));
    std::ofstream(swap.File("x.swp")) << "data";
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(dir.path() + "/ztrain-job"));
  // More than any disk has: refused, with the bytes needed, and nothing is left.
  ExpectIoErrorWith(
      [&] { SwapDir(dir.path(), "job", 0, 1, int64_t{1} << 62, "offload_optimizer"); },
      {"offload_optimizer needs", "4611686018427387904 bytes", "are free",
       "point nvme_path at a larger disk"});
  EXPECT_FALSE(fs::exists(dir.path() + "/ztrain-job"));
  EXPECT_THROW(SwapDir(dir.File("missing"), "job", 0, 1, 1, "offload_param"), IoError);
}

// Note [Swap space per node]: 4 ranks on a node need 4 MiB each; 15 MiB free is refused on
// every rank, naming the node's total, and 16 MiB is enough. A rank that starts after another
// counts what that one has already written as the node's: with rank 0's 4 MiB on the disk,
// 12 MiB free is enough for rank 1.
TEST(SwapDirTest, ChecksTheSpaceOfAllRanksOnTheNode) {
  TempDir dir;
  ExpectIoErrorWith(
      [&] { SwapDir(dir.path(), "job", 2, 4, 4 * kMiB, "offload", FakeFree(15 * kMiB), 4); },
      {"needs 16.00 MiB", "on this node", "its 4 ranks share that disk and each needs 4.00 MiB",
       "run fewer ranks per node"});
  { SwapDir swap(dir.path(), "job", 2, 4, 4 * kMiB, "offload", FakeFree(16 * kMiB), 4); }
  SwapDir rank0(dir.path(), "job", 0, 4, 4 * kMiB, "offload", FakeFree(16 * kMiB), 4);
  WriteFile(rank0.File("params.swp"), 4 * kMiB);
  { SwapDir rank1(dir.path(), "job", 1, 4, 4 * kMiB, "offload", FakeFree(12 * kMiB), 4); }
  ExpectIoErrorWith(
      [&] { SwapDir(dir.path(), "job", 1, 4, 4 * kMiB, "offload", FakeFree(11 * kMiB), 4); },
      {"in use by this node's other ranks"});
  // One rank per node checks only its own need.
  { SwapDir alone(dir.path(), "job", 3, 4, 4 * kMiB, "offload", FakeFree(4 * kMiB)); }
}

// Killed runs leave their files; the next run of the job counts them as free and removes
// them: 8 MiB free and 2 MiB stale fit 9 MiB but not 11 MiB.
TEST(SwapDirTest, ReclaimsTheFilesOfAKilledRun) {
  TempDir dir;
  const std::string rank0 = dir.path() + "/ztrain-job/rank0";
  auto leave_files = [&] {
    WriteFile(rank0 + "/params.swp", kMiB);
    WriteFile(rank0 + "/optimizer.swp", kMiB);
    WriteDeadLock(rank0);
  };
  leave_files();
  auto log = CaptureLog();
  {
    SwapDir swap(dir.path(), "job", 0, 1, 9 * kMiB, "offload", FakeFree(8 * kMiB));
    EXPECT_FALSE(fs::exists(rank0 + "/params.swp"));
    EXPECT_FALSE(fs::exists(rank0 + "/optimizer.swp"));
    EXPECT_TRUE(DirLock::IsHeld(rank0));
  }
  for (const std::string& part : std::vector<std::string>{
           "removed 2 swap files (2.", "left in " + rank0,
           "by an earlier run of job job that did not end cleanly (pid 4000000 on host gone"}) {
    EXPECT_NE(log->str().find(part), std::string::npos) << part << " not in: " << log->str();
  }
  leave_files();
  ExpectIoErrorWith(
      [&] { SwapDir(dir.path(), "job", 0, 1, 11 * kMiB, "offload", FakeFree(8 * kMiB)); },
      {"offload needs 11.00 MiB", "8.00 MiB free", "stale swap files", rank0,
       "point nvme_path at a larger disk"});
  EXPECT_FALSE(fs::exists(dir.path() + "/ztrain-job"));
}

TEST(SwapDirTest, RefusesADirectoryThatALiveProcessHolds) {
  TempDir dir;
  const pid_t child = StartHolder(dir.path(), 0, "params.swp");
  const std::string rank0 = dir.path() + "/ztrain-job/rank0";
  ExpectIoErrorWith([&] { SwapDir(dir.path(), "job", 0, 1, 1, "offload_param"); },
                    {"offload_param: swap directory " + rank0,
                     "is in use by a running job: pid " + std::to_string(child) + " on host ",
                     "give this run another training.job_name or nvme_path"});
  // The holder's files are untouched; another rank of the job is not in its way.
  EXPECT_TRUE(fs::exists(rank0 + "/params.swp"));
  { SwapDir other(dir.path(), "job", 1, 2, 1, "offload_param"); }
  Kill(child);
}

TEST(SwapDirTest, RefusesASecondSwapDirOfTheSameRankInOneProcess) {
  TempDir dir;
  SwapDir first(dir.path(), "job", 0, 1, 1, "offload_param");
  ExpectIoErrorWith([&] { SwapDir(dir.path(), "job", 0, 1, 1, "offload_optimizer"); },
                    {"is in use by a running job: this process (pid " + std::to_string(getpid())});
  EXPECT_TRUE(fs::is_directory(first.path()));
  EXPECT_TRUE(DirLock::IsHeld(first.path()));
}

// The kernel drops a SIGKILLed holder's lock: the next run takes the directory over.
TEST(SwapDirTest, ASigkilledHolderLeavesNoLockBehind) {
  TempDir dir;
  const pid_t child = StartHolder(dir.path(), 0, "optimizer.swp");
  const std::string rank0 = dir.path() + "/ztrain-job/rank0";
  Kill(child);
  EXPECT_FALSE(DirLock::IsHeld(rank0));
  auto log = CaptureLog();
  {
    SwapDir swap(dir.path(), "job", 0, 1, 1, "offload_param");
    EXPECT_FALSE(fs::exists(rank0 + "/optimizer.swp"));
  }
  EXPECT_NE(log->str().find("removed 1 swap file (256.00 KiB) left in " + rank0), std::string::npos)
      << log->str();
  EXPECT_NE(log->str().find("(pid " + std::to_string(child) + " on host "), std::string::npos)
      << log->str();
  EXPECT_FALSE(fs::exists(dir.path() + "/ztrain-job"));
}

// Rank directories from 2 up that no live process holds were left by an earlier run with
// more ranks: named with their sizes and the rm command (in the space error, or in a
// warning), never deleted. rank1 belongs to this run's rank 1 and rank6 to a live holder.
TEST(SwapDirTest, NamesStaleDirectoriesOfOtherRanksWithTheCommandToRemoveThem) {
  TempDir parent;
  const std::string nvme = parent.File("it's nvme");  // a quote the command must survive
  const std::string job = nvme + "/ztrain-job";
  WriteFile(job + "/rank5/params.swp", kMiB);  // no lock file: an older ztrain, or lost
  WriteFile(job + "/rank7/optimizer.swp", 2 * kMiB);
  WriteDeadLock(job + "/rank7");
  WriteFile(job + "/rank1/params.swp", kMiB);
  const pid_t child = StartHolder(nvme, 6, "params.swp");
  const std::string rm = "rm -rf '" + parent.path() + "/it'\\''s nvme/ztrain-job/rank5' '" +
                         parent.path() + "/it'\\''s nvme/ztrain-job/rank7'";
  try {
    SwapDir swap(nvme, "job", 0, 2, 5 * kMiB, "offload", FakeFree(4 * kMiB));
    ADD_FAILURE() << "expected an IoError";
  } catch (const IoError& e) {
    const std::string msg = e.what();
    for (const std::string& part : std::vector<std::string>{
             "offload needs 5.00 MiB", "only 4.00 MiB are free", job + "/rank5 (1.",
             job + "/rank7 (2.", "remove them with: " + rm}) {
      EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
    }
    EXPECT_EQ(msg.find("rank1"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("rank6"), std::string::npos) << msg;
  }
  auto log = CaptureLog();
  { SwapDir swap(nvme, "job", 0, 2, kMiB, "offload", FakeFree(4 * kMiB)); }
  EXPECT_NE(log->str().find("that no running process holds: " + job + "/rank5 (1."),
            std::string::npos)
      << log->str();
  EXPECT_NE(log->str().find("remove them with: " + rm), std::string::npos) << log->str();
  for (const char* rank : {"rank1", "rank5", "rank6", "rank7"}) {
    EXPECT_TRUE(fs::exists(job + "/" + rank + "/" +
                           (rank == std::string("rank7") ? "optimizer.swp" : "params.swp")))
        << rank;
  }
  Kill(child);
}

}  // namespace
}  // namespace ztrain::offload
