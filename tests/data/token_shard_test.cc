#include "data/token_shard.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
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

std::vector<uint8_t> HeaderBytes(int32_t magic, int32_t version, int32_t count) {
  std::vector<uint8_t> out;
  PutLe32(out, static_cast<uint32_t>(magic));
  PutLe32(out, static_cast<uint32_t>(version));
  PutLe32(out, static_cast<uint32_t>(count));
  for (int i = 3; i < 256; ++i) PutLe32(out, 0);
  return out;
}

// The bytes of a shard built from the format description, independently of WriteTokenShard.
std::vector<uint8_t> ExpectedShardBytes(int32_t magic, int32_t version, int32_t count,
                                        const std::vector<uint16_t>& tokens) {
  std::vector<uint8_t> out = HeaderBytes(magic, version, count);
  for (uint16_t t : tokens) {
    out.push_back(static_cast<uint8_t>(t & 0xff));
    out.push_back(static_cast<uint8_t>(t >> 8));
  }
  return out;
}

// The same with uint32 tokens (llm.c's llama-3 format unless told otherwise).
std::vector<uint8_t> ExpectedUint32ShardBytes(const std::vector<uint32_t>& tokens,
                                              int32_t magic = 20240801, int32_t version = 7) {
  std::vector<uint8_t> out = HeaderBytes(magic, version, static_cast<int32_t>(tokens.size()));
  for (uint32_t t : tokens) PutLe32(out, t);
  return out;
}

TEST(TokenShardTest, WritesLlmcBytesExactly) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {0, 1, 258, 65535, 513, 50256};
  const std::string path = dir.File("a.bin");
  WriteTokenShard(path, tokens, TokenFormat::kUint16);
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
  WriteTokenShard(path, tokens, TokenFormat::kUint16);
  const TokenShard shard = TokenShard::Open(path);
  EXPECT_EQ(shard.path(), path);
  ASSERT_EQ(shard.size(), 100'003);
  EXPECT_EQ(shard.format(), TokenFormat::kUint16);
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), shard.tokens().As<uint16_t>().begin()));
}

TEST(TokenShardTest, ReadsAFileBuiltByHand) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {7, 8, 9};
  WriteBytes(dir.File("hand.bin"), ExpectedShardBytes(20240520, 1, 3, tokens));
  const TokenShard shard = TokenShard::Open(dir.File("hand.bin"));
  const std::span<const uint16_t> read = shard.tokens().As<uint16_t>();
  EXPECT_EQ(std::vector<uint16_t>(read.begin(), read.end()), tokens);
}

TEST(TokenShardTest, OverwritesAnExistingShard) {
  TempDir dir;
  const std::string path = dir.File("a.bin");
  WriteTokenShard(path, std::vector<uint16_t>(50, 3), TokenFormat::kUint16);
  WriteTokenShard(path, std::vector<uint16_t>{4, 5}, TokenFormat::kUint16);
  EXPECT_EQ(ReadBytes(path), ExpectedShardBytes(20240520, 1, 2, {4, 5}));
}

TEST(TokenShardTest, MovedShardKeepsItsTokens) {
  TempDir dir;
  WriteTokenShard(dir.File("a.bin"), std::vector<uint16_t>{1, 2, 3}, TokenFormat::kUint16);
  TokenShard a = TokenShard::Open(dir.File("a.bin"));
  TokenShard b = std::move(a);
  EXPECT_EQ(b.size(), 3);
  EXPECT_EQ(b.tokens()[2], 3u);
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
                           {"bad magic 12345", "llm.c model file", "magic 20240520 version 1",
                            "uint16 tokens", "magic 20240801 version 7", "uint32 tokens"});
}

TEST(TokenShardTest, RejectsAnotherVersion) {
  TempDir dir;
  WriteBytes(dir.File("v2.bin"), ExpectedShardBytes(20240520, 2, 2, {1, 2}));
  ExpectErrorWith<IoError>(
      [&] { TokenShard::Open(dir.File("v2.bin")); },
      {dir.File("v2.bin"), "magic 20240520 with unsupported version 2",
       "magic 20240520 version 1 (uint16", "magic 20240801 version 7 (uint32"});
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
  ExpectErrorWith<IoError>([&] { WriteTokenShard(dir.File("w.bin"), {}, TokenFormat::kUint16); },
                           {"w.bin", "0 tokens"});
}

TEST(TokenShardTest, RejectsAMissingFile) {
  TempDir dir;
  ExpectErrorWith<IoError>([&] { TokenShard::Open(dir.File("none.bin")); },
                           {dir.File("none.bin"), "No such file"});
}

// The header and the tokens byte for byte, from the format's description: magic 20240801 at
// offset 0, version 7 at 4, the count at 8, zeros to 1024, then each id in 4 little-endian bytes.
TEST(Uint32TokenShardTest, WritesLlmcBytesExactly) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 128255, 0x01020304, 0xFFFFFFFF};
  const std::string path = dir.File("l3.bin");
  WriteTokenShard(path, tokens, TokenFormat::kUint32);
  std::vector<uint8_t> expected(1024, 0);
  expected[0] = 0xA1, expected[1] = 0xD9, expected[2] = 0x34, expected[3] = 0x01;  // 20240801
  expected[4] = 7;                                                                 // version
  expected[8] = 6;                                                                 // count
  for (uint8_t b : {0x00, 0x00, 0x00, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
                    0xFF, 0xF4, 0x01, 0x00, 0x04, 0x03, 0x02, 0x01, 0xFF, 0xFF, 0xFF, 0xFF}) {
    expected.push_back(b);
  }
  EXPECT_EQ(ReadBytes(path), expected);
  EXPECT_EQ(ExpectedUint32ShardBytes(tokens), expected);  // the helper the tests below use
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  const TokenShard shard = TokenShard::Open(path);
  EXPECT_EQ(shard.format(), TokenFormat::kUint32);
  EXPECT_EQ(shard.tokens().ToVector(), tokens);
  EXPECT_EQ(shard.tokens()[3], 128255u);
}

TEST(Uint32TokenShardTest, ReadsBackWhatWasWritten) {
  TempDir dir;
  Xoshiro256 rng(8);
  std::vector<uint32_t> tokens(100'003);
  for (uint32_t& t : tokens) t = static_cast<uint32_t>(rng.Next());
  const std::string path = dir.File("big.bin");
  WriteTokenShard(path, tokens, TokenFormat::kUint32);
  EXPECT_EQ(std::filesystem::file_size(path), 1024u + 4u * 100'003u);
  const TokenShard shard = TokenShard::Open(path);
  ASSERT_EQ(shard.size(), 100'003);
  ASSERT_EQ(shard.format(), TokenFormat::kUint32);
  const std::span<const uint32_t> read = shard.tokens().As<uint32_t>();
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), read.begin()));
}

TEST(Uint32TokenShardTest, ReadsAFileBuiltByHand) {
  TempDir dir;
  WriteBytes(dir.File("hand.bin"), ExpectedUint32ShardBytes({70000, 3, 128255}));
  const TokenShard shard = TokenShard::Open(dir.File("hand.bin"));
  EXPECT_EQ(shard.format(), TokenFormat::kUint32);
  EXPECT_EQ(shard.tokens().ToVector(), (std::vector<uint32_t>{70000, 3, 128255}));
}

// Tokens stored in one width are written in the other: 150,001 of them cross the writer's
// 65,536-token conversion blocks.
TEST(Uint32TokenShardTest, ConvertsBetweenWidthsOnWrite) {
  TempDir dir;
  std::vector<uint16_t> narrow(150'001);
  for (size_t i = 0; i < narrow.size(); ++i) narrow[i] = static_cast<uint16_t>(i * 7919);
  const std::vector<uint32_t> wide(narrow.begin(), narrow.end());
  WriteTokenShard(dir.File("widened.bin"), narrow, TokenFormat::kUint32);
  EXPECT_EQ(ReadBytes(dir.File("widened.bin")), ExpectedUint32ShardBytes(wide));
  WriteTokenShard(dir.File("narrowed.bin"), wide, TokenFormat::kUint16);
  EXPECT_EQ(ReadBytes(dir.File("narrowed.bin")), ExpectedShardBytes(20240520, 1, 150'001, narrow));
}

TEST(Uint32TokenShardTest, RefusesIdsAbove65535AsUint16AndWritesNothing) {
  TempDir dir;
  std::vector<uint32_t> tokens(1000, 5);
  tokens[765] = 65536;
  tokens[900] = 128255;
  ExpectErrorWith<IoError>(
      [&] { WriteTokenShard(dir.File("u16.bin"), tokens, TokenFormat::kUint16); },
      {"token 65536 at index 765", dir.File("u16.bin"), "below 65536", "uint32 format"});
  EXPECT_FALSE(std::filesystem::exists(dir.File("u16.bin")));
  EXPECT_FALSE(std::filesystem::exists(dir.File("u16.bin.tmp")));
}

// A magic of one format with the version of the other (or another version) names both formats.
TEST(Uint32TokenShardTest, RejectsAVersionTheMagicDoesNotHave) {
  TempDir dir;
  for (const std::pair<int32_t, int32_t>& header :
       {std::pair{20240801, 1}, std::pair{20240801, 2}, std::pair{20240520, 7}}) {
    const int32_t magic = header.first, version = header.second;
    WriteBytes(dir.File("v.bin"), ExpectedUint32ShardBytes({1, 2}, magic, version));
    ExpectErrorWith<IoError>(
        [&] { TokenShard::Open(dir.File("v.bin")); },
        {dir.File("v.bin"),
         "magic " + std::to_string(magic) + " with unsupported version " + std::to_string(version),
         "magic 20240520 version 1 (uint16 tokens", "magic 20240801 version 7 (uint32 tokens"});
  }
}

TEST(Uint32TokenShardTest, RejectsATruncatedFile) {
  TempDir dir;
  std::vector<uint8_t> bytes = ExpectedUint32ShardBytes({1, 2, 3, 4});
  bytes.pop_back();
  WriteBytes(dir.File("cut.bin"), bytes);
  ExpectErrorWith<IoError>(
      [&] { TokenShard::Open(dir.File("cut.bin")); },
      {dir.File("cut.bin"), "truncated", "4 uint32 tokens need 1040 bytes", "the file has 1039"});
}

TEST(Uint32TokenShardTest, RejectsTrailingBytes) {
  TempDir dir;
  std::vector<uint8_t> bytes = ExpectedUint32ShardBytes({1, 2, 3});
  bytes[8] = 2;  // the header says 2 tokens; the file holds 3
  WriteBytes(dir.File("long.bin"), bytes);
  ExpectErrorWith<IoError>(
      [&] { TokenShard::Open(dir.File("long.bin")); },
      {"longer than its header says", "2 uint32 tokens need 1032 bytes", "the file has 1036"});
}

// uint16 tokens under a uint32 header (and the other way round): the sizes say what happened.
TEST(Uint32TokenShardTest, NamesAHeaderOfTheWrongWidth) {
  TempDir dir;
  std::vector<uint8_t> bytes = ExpectedShardBytes(20240801, 7, 4, {1, 2, 3, 4});
  WriteBytes(dir.File("w.bin"), bytes);
  ExpectErrorWith<IoError>([&] { TokenShard::Open(dir.File("w.bin")); },
                           {"truncated", "4 uint32 tokens need 1040 bytes", "the file has 1032",
                            "what 4 uint16 tokens fill", "wrong format"});
  WriteBytes(dir.File("n.bin"), ExpectedUint32ShardBytes({1, 2}, 20240520, 1));
  ExpectErrorWith<IoError>([&] { TokenShard::Open(dir.File("n.bin")); },
                           {"longer than its header says", "2 uint16 tokens need 1028 bytes",
                            "the file has 1032", "what 2 uint32 tokens fill"});
}

TEST(Uint32TokenShardTest, RejectsAnEmptyShard) {
  TempDir dir;
  WriteBytes(dir.File("empty.bin"), ExpectedUint32ShardBytes({}));
  ExpectErrorWith<IoError>([&] { TokenShard::Open(dir.File("empty.bin")); },
                           {"0 tokens", "at least 1"});
  ExpectErrorWith<IoError>(
      [&] { WriteTokenShard(dir.File("w.bin"), std::vector<uint32_t>{}, TokenFormat::kUint32); },
      {"w.bin", "0 tokens"});
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
