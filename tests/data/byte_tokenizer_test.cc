#include "data/byte_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/token_shard.h"
#include "data/token_source.h"
#include "tests/data/data_test_util.h"

namespace ztrain::data {
namespace {

using test_util::ExpectErrorWith;
using test_util::ReadBytes;
using test_util::TempDir;
using test_util::WriteBytes;

void WriteText(const std::string& path, const std::string& text) {
  WriteBytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

TEST(ByteTokenizerTest, TextToShardWritesOneTokenPerByte) {
  TempDir dir;
  // 2-, 3- and 4-byte UTF-8 sequences: é, 世, 界, 🙂.
  const std::string text = "h\xC3\xA9llo, \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82\n";
  ASSERT_EQ(text.size(), 20u);
  WriteText(dir.File("in.txt"), text);
  EXPECT_EQ(TextToShard(dir.File("in.txt"), dir.File("out.bin"), TokenFormat::kUint16), 20);

  std::vector<uint8_t> expected(1024, 0);
  expected[0] = 0x88, expected[1] = 0xD8, expected[2] = 0x34, expected[3] = 0x01;  // 20240520
  expected[4] = 1;                                                                 // version
  expected[8] = 20;                                                                // count
  for (char c : text) {
    expected.push_back(static_cast<uint8_t>(c));
    expected.push_back(0);
  }
  EXPECT_EQ(ReadBytes(dir.File("out.bin")), expected);

  const TokenShard shard = TokenShard::Open(dir.File("out.bin"));
  const std::span<const uint16_t> read = shard.tokens().As<uint16_t>();
  const std::vector<int32_t> tokens(read.begin(), read.end());
  EXPECT_EQ(tokens[1], 0xC3);
  EXPECT_EQ(Decode(tokens), text);
}

TEST(ByteTokenizerTest, InvalidUtf8NamesTheOffsetAndWritesNothing) {
  TempDir dir;
  WriteText(dir.File("bad.txt"), "abc\xC3(def");
  ExpectErrorWith<Error>(
      [&] { TextToShard(dir.File("bad.txt"), dir.File("out.bin"), TokenFormat::kUint16); },
      {dir.File("bad.txt"), "offset 4", "0x28", "UTF-8"});
  EXPECT_FALSE(std::filesystem::exists(dir.File("out.bin")));
  EXPECT_FALSE(std::filesystem::exists(dir.File("out.bin.tmp")));
}

TEST(ByteTokenizerTest, FindsTheFirstInvalidByte) {
  EXPECT_EQ(FindInvalidUtf8(""), -1);
  EXPECT_EQ(FindInvalidUtf8("plain ascii"), -1);
  EXPECT_EQ(FindInvalidUtf8("\xF4\x8F\xBF\xBF ok \xEF\xBF\xBD"), -1);  // U+10FFFF, U+FFFD
  EXPECT_EQ(FindInvalidUtf8("a\x80"), 1);                              // stray continuation byte
  EXPECT_EQ(FindInvalidUtf8("\xC0\x80"), 0);                           // overlong NUL
  EXPECT_EQ(FindInvalidUtf8("xy\xE0\x80\x80"), 3);                     // overlong 3-byte form
  EXPECT_EQ(FindInvalidUtf8("\xED\xA0\x80"), 1);                       // UTF-16 surrogate D800
  EXPECT_EQ(FindInvalidUtf8("\xF4\x90\x80\x80"), 1);                   // above U+10FFFF
  EXPECT_EQ(FindInvalidUtf8("\xF5\x80\x80\x80"), 0);                   // lead byte never used
  EXPECT_EQ(FindInvalidUtf8("\xE2\x82\xAC\xE2\x82"), 3);  // text ends inside a sequence
  EXPECT_EQ(FindInvalidUtf8("\xF0\x9F\x99x"), 3);         // sequence cut by ASCII
  EXPECT_EQ(FindInvalidUtf8(std::string("a\xFF", 2)), 1);
}

TEST(ByteTokenizerTest, SplitsLongTextIntoNumberedShards) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 25; ++i) text.push_back(static_cast<char>('a' + i));
  WriteText(dir.File("in.txt"), text);
  EXPECT_EQ(TextToShard(dir.File("in.txt"), dir.File("out.bin"), TokenFormat::kUint16, 10), 25);
  EXPECT_FALSE(std::filesystem::exists(dir.File("out.bin")));
  EXPECT_EQ(SplitShardPath(dir.File("out.bin"), 2), dir.File("out_000002.bin"));
  const ShardFileSource source(dir.File("out_*.bin"));
  ASSERT_EQ(source.num_shards(), 3);
  EXPECT_EQ(source.shard_name(0), dir.File("out_000000.bin"));
  EXPECT_EQ(source.shard(0).size(), 10u);
  EXPECT_EQ(source.shard(2).size(), 5u);
  std::vector<int32_t> all;
  for (int s = 0; s < 3; ++s) {
    const std::vector<uint32_t> tokens = source.shard(s).ToVector();
    all.insert(all.end(), tokens.begin(), tokens.end());
  }
  EXPECT_EQ(Decode(all), text);
}

TEST(ByteTokenizerTest, RejectsEmptyAndMissingFiles) {
  TempDir dir;
  WriteText(dir.File("empty.txt"), "");
  ExpectErrorWith<IoError>(
      [&] { TextToShard(dir.File("empty.txt"), dir.File("o.bin"), TokenFormat::kUint16); },
      {dir.File("empty.txt"), "empty"});
  ExpectErrorWith<IoError>(
      [&] { TextToShard(dir.File("none.txt"), dir.File("o.bin"), TokenFormat::kUint16); },
      {dir.File("none.txt")});
}

TEST(ByteTokenizerTest, DecodeMarksTokensOutsideBytes) {
  EXPECT_EQ(Decode(std::vector<int32_t>{'o', 'k', 300, '!', -1}), "ok\xEF\xBF\xBD!\xEF\xBF\xBD");
  EXPECT_EQ(EncodeBytes("\xC3\xA9"), (std::vector<uint16_t>{0xC3, 0xA9}));
}

}  // namespace
}  // namespace ztrain::data
