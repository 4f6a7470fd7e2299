// Round trips of random bytes through SwapFile on every engine variant: awkward sizes, many
// requests in flight over several files, reopening, and teardown with I/O in flight.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "offload/io/io_options.h"
#include "tests/offload/io_test_util.h"

namespace ztrain::offload {
namespace {

using test_util::Buffers;
using test_util::EngineVariant;
using test_util::RandomBytes;
using test_util::SameBytes;
using test_util::TempDir;

class IoRoundTripTest : public ::testing::TestWithParam<EngineVariant> {
 protected:
  const IoOptions& options() const { return GetParam().options; }
  TempDir dir_;
  Buffers buffers_;
};

// Sizes that are not multiples of the alignment or of the 64 KiB pieces, and larger than the
// queue_depth x block_size (256 KiB) in flight at once.
std::vector<int64_t> AwkwardSizes() {
  const int64_t block = 64 << 10;
  return {1, 4095, 4096, 4097, block * 7 / 2, 4 * block + 12345, (1 << 20) + 77};
}

TEST_P(IoRoundTripTest, AwkwardSizesComeBackExactly) {
  ZTRAIN_MAKE_ENGINE_OR_SKIP(engine, options());
  const std::vector<int64_t> sizes = AwkwardSizes();
  int64_t total = 0;
  int64_t pieces = 0;
  std::vector<int64_t> offsets;
  for (int64_t s : sizes) {
    offsets.push_back(total);
    total += AlignUp(s);
    pieces += (AlignUp(s) + options().block_size - 1) / options().block_size;
  }
  auto file = SwapFile::Create(*engine, dir_.File("awkward.swap"), total);
  EXPECT_EQ(file->size(), total);
  std::vector<std::vector<char>> data;
  std::vector<IoBuffer> out;
  std::vector<IoWorkPtr> work;
  for (size_t i = 0; i < sizes.size(); ++i) {  // every write in flight at once
    data.push_back(RandomBytes(sizes[i], 100 + i));
    out.push_back(buffers_.With(data.back()));
    work.push_back(file->Write(offsets[i], out.back(), sizes[i]));
  }
  for (IoWorkPtr& w : work) w->Wait();
  std::vector<IoBuffer> in;
  work.clear();
  for (size_t i = 0; i < sizes.size(); ++i) {
    in.push_back(buffers_.Make(sizes[i]));
    work.push_back(file->Read(offsets[i], in.back(), sizes[i]));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    work[i]->Wait();
    EXPECT_TRUE(work[i]->Done());
    EXPECT_TRUE(SameBytes(in[i], data[i])) << "size " << sizes[i];
  }
  const IoStats stats = engine->stats();
  EXPECT_EQ(stats.bytes_written, total);  // each transfer rounded up to the alignment
  EXPECT_EQ(stats.bytes_read, total);
  EXPECT_EQ(stats.pieces, 2 * pieces);
  EXPECT_EQ(stats.requests, 2 * static_cast<int64_t>(sizes.size()));
  EXPECT_EQ(stats.failures, 0);
}

TEST_P(IoRoundTripTest, ManyRequestsInFlightAcrossFiles) {
  ZTRAIN_MAKE_ENGINE_OR_SKIP(engine, options());
  constexpr int kFiles = 4;
  constexpr int kRecords = 12;
  constexpr int64_t kRecord = 150000;  // 3 pieces of 64 KiB, the last one partly used
  const int64_t stride = AlignUp(kRecord);
  std::vector<std::unique_ptr<SwapFile>> files;
  for (int f = 0; f < kFiles; ++f) {
    files.push_back(
        SwapFile::Create(*engine, dir_.File(std::to_string(f) + ".swap"), kRecords * stride));
  }
  std::vector<std::vector<char>> data;
  std::vector<IoBuffer> out;
  std::vector<IoWorkPtr> work;
  for (int r = 0; r < kRecords; ++r) {  // interleaved over the files
    for (int f = 0; f < kFiles; ++f) {
      data.push_back(RandomBytes(kRecord, 7 * r + f));
      out.push_back(buffers_.With(data.back()));
      work.push_back(files[f]->Write(r * stride, out.back(), kRecord));
    }
  }
  for (IoWorkPtr& w : work) w->Wait();
  std::vector<IoBuffer> in;
  work.clear();
  for (int r = kRecords - 1; r >= 0; --r) {  // read back in the other order
    for (int f = 0; f < kFiles; ++f) {
      in.push_back(buffers_.Make(kRecord));
      work.push_back(files[f]->Read(r * stride, in.back(), kRecord));
    }
  }
  size_t i = 0;
  for (int r = kRecords - 1; r >= 0; --r) {
    for (int f = 0; f < kFiles; ++f, ++i) {
      work[i]->Wait();
      EXPECT_TRUE(SameBytes(in[i], data[r * kFiles + f])) << "file " << f << " record " << r;
    }
  }
}

TEST_P(IoRoundTripTest, ReopenedFileHoldsWhatWasWritten) {
  ZTRAIN_MAKE_ENGINE_OR_SKIP(engine, options());
  const std::vector<char> data = RandomBytes(300000, 5);
  const std::string path = dir_.File("reopen.swap");
  {
    auto file = SwapFile::Create(*engine, path, 300000);
    IoBuffer out = buffers_.With(data);
    file->Write(0, out, 300000)->Wait();
  }
  auto file = SwapFile::Open(*engine, path);
  EXPECT_EQ(file->size(), AlignUp(300000));
  IoBuffer in = buffers_.Make(300000);
  file->Read(0, in, 300000)->Wait();
  EXPECT_TRUE(SameBytes(in, data));
}

TEST_P(IoRoundTripTest, DestroyingEngineAndFileWaitsForIoInFlight) {
  const std::string path = dir_.File("teardown.swap");
  constexpr int64_t kBytes = 1 << 20;
  const std::vector<char> data = RandomBytes(kBytes, 9);
  IoBuffer out = buffers_.With(data);
  std::vector<IoWorkPtr> work;
  {
    ZTRAIN_MAKE_ENGINE_OR_SKIP(engine, options());
    auto file = SwapFile::Create(*engine, path, 4 * kBytes);
    for (int i = 0; i < 4; ++i) work.push_back(file->Write(i * kBytes, out, kBytes));
    file.reset();  // the descriptor stays open for the writes in flight
  }                // the engine waits for them
  for (IoWorkPtr& w : work) {
    EXPECT_TRUE(w->Done());
    w->Wait();
  }
  work.clear();  // work objects are safe to drop after Wait
  auto engine = IoEngine::Make(options());
  auto file = SwapFile::Open(*engine, path);
  IoBuffer in = buffers_.Make(kBytes);
  for (int i = 0; i < 4; ++i) {
    file->Read(i * kBytes, in, kBytes)->Wait();
    EXPECT_TRUE(SameBytes(in, data)) << "block " << i;
  }
}

TEST_P(IoRoundTripTest, BackendSaysWhatRuns) {
  ZTRAIN_MAKE_ENGINE_OR_SKIP(engine, options());
  const std::string backend = engine->backend();
  if (options().force_fallback) {
    EXPECT_FALSE(engine->uses_io_uring());
    EXPECT_NE(backend.find("pread/pwrite"), std::string::npos) << backend;
    EXPECT_NE(backend.find("disabled by option"), std::string::npos) << backend;
    EXPECT_NE(backend.find(std::to_string(options().threads) + " thread"), std::string::npos)
        << backend;
  } else {
    EXPECT_NE(backend.find("io_uring (O_DIRECT), queue depth 4"), std::string::npos) << backend;
  }
}

TEST_P(IoRoundTripTest, ZeroBytesIsDoneAtOnce) {
  ZTRAIN_MAKE_ENGINE_OR_SKIP(engine, options());
  auto file = SwapFile::Create(*engine, dir_.File("zero.swap"), 4096);
  IoBuffer b = buffers_.Make(1);
  IoWorkPtr w = file->Read(0, b, 0);
  EXPECT_TRUE(w->Done());
  w->Wait();
}

INSTANTIATE_TEST_SUITE_P(Engines, IoRoundTripTest, ::testing::ValuesIn(test_util::EngineVariants()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace ztrain::offload
