#include "data/token_shard.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/random.h"
#include "tests/data/data_test_util.h"

namespace ztrain::data {
namespace {

using test_util::ExpectErrorWith;
using test_util::ReadBytes;
using test_util::TempDir;
using test_util::WriteBytes;

void PutLe32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// The bytes of a shard built from the format description, independently of WriteTokenShard.
std::vector<uint8_t> ExpectedShardBytes(int32_t magic, int32_t version, int32_t count,
                                        const std::vector<uint16_t>& tokens) {
  std::vector<uint8_t> out;
  PutLe32(out, static_cast<uint32_t>(magic));
  PutLe32(out, static_cast<uint32_t>(version));
  PutLe32(out, static_cast<uint32_t>(count));
  for (int i = 3; i < 256; ++i) PutLe32(out, 0);
  for (uint16_t t : tokens) {
    out.push_back(static_cast<uint8_t>(t & 0xff));
    out.push_back(static_cast<uint8_t>(t >> 8));
  }
  return out;
}

TEST(TokenShardTest, WritesLlmcBytesExactly) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {0, 1, 258, 65535, 513, 50256};
  const std::string path = dir.File("a.bin");
  WriteTokenShard(path, tokens);
  const std::vector<uint8_t> expected = ExpectedShardBytes(20240520, 1, 6, tokens);
  EXPECT_EQ(ReadBytes(path), expected);
  EXPECT_EQ(expected.size(), 1024u + 12u);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(TokenShardTest, ReadsBackWhatWasWritten) {
  TempDir dir;
  Xoshiro256 rng(7);
  std::vector<uint16_t> tokens(100'003);
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(rng.Below(65536));
  const std::string path = dir.File("big.bin");
  WriteTokenShard(path, tokens);
  const TokenShard shard = TokenShard::Open(path);
  EXPECT_EQ(shard.path(), path);
  ASSERT_EQ(shard.size(), 100'003);
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), shard.tokens().begin()));
}

TEST(TokenShardTest, ReadsAFileBuiltByHand) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {7, 8, 9};
  WriteBytes(dir.File("hand.bin"), ExpectedShardBytes(20240520, 1, 3, tokens));
  const TokenShard shard = TokenShard::Open(dir.File("hand.bin"));
  EXPECT_EQ(std::vector<uint16_t>(shard.tokens().begin(), shard.tokens().end()), tokens);
}

TEST(TokenShardTest, OverwritesAnExistingShard) {
  TempDir dir;
  const std::string path = dir.File("a.bin");
  WriteTokenShard(path, std::vector<uint16_t>(50, 3));
  WriteTokenShard(path, std::vector<uint16_t>{4, 5});
  EXPECT_EQ(ReadBytes(path), ExpectedShardBytes(20240520, 1, 2, {4, 5}));
}

TEST(TokenShardTest, MovedShardKeepsItsTokens) {
  TempDir dir;
  WriteTokenShard(dir.File("a.bin"), std::vector<uint16_t>{1, 2, 3});
  TokenShard a = TokenShard::Open(dir.File("a.bin"));
  TokenShard b = std::move(a);
  EXPECT_EQ(b.size(), 3);
  EXPECT_EQ(b.tokens()[2], 3);
  EXPECT_EQ(a.size(), 0);  // NOLINT(bugprone-use-after-move): moved-from is empty
}

TEST(TokenShardTest, RejectsAnLlmcModelFile) {
  TempDir dir;
  WriteBytes(dir.File("model.bin"), ExpectedShardBytes(20240326, 3, 2, {1, 2}));
  ExpectErrorWith<IoError>([&] { TokenShard::Open(dir.File("model.bin")); },
                           {dir.File("model.bin"), "bad magic 20240326", "20240520", "model"});
}

TEST(TokenShardTest, RejectsAnUnknownMagic) {
  TempDir dir;
  WriteBytes(dir.File("x.bin"), ExpectedShardBytes(12345, 1, 2, {1, 2}));
  ExpectErrorWith<IoError>([&] { TokenShard::Open(dir.File("x.bin")); },
                           {"bad magic 12345", "llm.c model file", "version"});
}

TEST(TokenShardTest, RejectsAnotherVersion) {
  TempDir dir;
  WriteBytes(dir.File("v2.bin"), ExpectedShardBytes(20240520, 2, 2, {1, 2}));
  ExpectErrorWith<IoError>([&] { TokenShard::Open(dir.File("v2.bin")); },
                           {dir.File("v2.bin"), "version 2"});
}

TEST(TokenShardTest, RejectsATruncatedFile) {
  TempDir dir;
  std::vector<uint8_t> bytes = ExpectedShardBytes(20240520, 1, 4, {1, 2, 3, 4});
  bytes.pop_back();
  WriteBytes(dir.File("cut.bin"), bytes);
  ExpectErrorWith<IoError>([&] { TokenShard::Open(dir.File("cut.bin")); },
                           {dir.File("cut.bin"), "truncated", "1032", "1031"});
}

TEST(TokenShardTest, RejectsTrailingBytes) {
  TempDir dir;
  std::vector<uint8_t> bytes = ExpectedShardBytes(20240520, 1, 1, {1, 2});
  WriteBytes(dir.File("long.bin"), bytes);
  ExpectErrorWith<IoError>([&] { TokenShard::Open(dir.File("long.bin")); }, {"1026", "1028"});
}

TEST(TokenShardTest, RejectsAFileShorterThanTheHeader) {
  TempDir dir;
  WriteBytes(dir.File("tiny.bin"), {1, 2, 3});
  ExpectErrorWith<IoError>([&] { TokenShard::Open(dir.File("tiny.bin")); },
                           {dir.File("tiny.bin"), "3 bytes", "header"});
}

TEST(TokenShardTest, RejectsAnEmptyShard) {
  TempDir dir;
  WriteBytes(dir.File("empty.bin"), ExpectedShardBytes(20240520, 1, 0, {}));
  ExpectErrorWith<IoError>([&] { TokenShard::Open(dir.File("empty.bin")); },
                           {"0 tokens", "at least 1"});
  ExpectErrorWith<IoError>([&] { WriteTokenShard(dir.File("w.bin"), {}); }, {"w.bin", "0 tokens"});
}

TEST(TokenShardTest, RejectsAMissingFile) {
  TempDir dir;
  ExpectErrorWith<IoError>([&] { TokenShard::Open(dir.File("none.bin")); },
                           {dir.File("none.bin"), "No such file"});
}

TEST(ExpandGlobTest, ReturnsMatchesSorted) {
  TempDir dir;
  for (const char* name : {"c_01.bin", "a_10.bin", "a_02.bin", "notes.txt"}) {
    WriteBytes(dir.File(name), {0});
  }
  EXPECT_EQ(
      ExpandGlob(dir.File("*.bin")),
      (std::vector<std::string>{dir.File("a_02.bin"), dir.File("a_10.bin"), dir.File("c_01.bin")}));
  EXPECT_EQ(ExpandGlob(dir.File("notes.txt")), std::vector<std::string>{dir.File("notes.txt")});
}

TEST(ExpandGlobTest, NoMatchNamesThePattern) {
  TempDir dir;
  ExpectErrorWith<IoError>([&] { ExpandGlob(dir.File("*_train_*.bin")); },
                           {"no files match", dir.File("*_train_*.bin")});
}

}  // namespace
}  // namespace ztrain::data
