#include "data/byte_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
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

TEST(ByteTokenizerTest, DecodeMarksTokensOutsideBytes) {
  EXPECT_EQ(Decode(std::vector<int32_t>{'o', 'k', 300, '!', -1}), "ok\xEF\xBF\xBD!\xEF\xBF\xBD");
  EXPECT_EQ(EncodeBytes("\xC3\xA9"), (std::vector<uint16_t>{0xC3, 0xA9}));
}

// Python's bytes.decode("utf-8", errors="replace") is the stated policy: random byte strings
// rich in lead, continuation and invalid bytes, repaired here and by python3, must agree.
TEST(ByteTokenizerTest, ReplacesInvalidUtf8AsPythonDoes) {
  TempDir dir;
  std::mt19937 rng(7);
  const unsigned char alphabet[] = {'a', ' ', 0x80, 0x8F, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xDF,
                                    0xE0, 0xE2, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF};
  std::vector<std::string> inputs;
  std::string all;
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 9);
    for (int k = 0; k < n; ++k) s.push_back(static_cast<char>(alphabet[rng() % sizeof(alphabet)]));
    inputs.push_back(s);
    all += std::to_string(s.size()) + ":" + s;
  }
  WriteText(dir.File("in.bin"), all);
  const std::string script =
      "import sys\n"
      "d=open(sys.argv[1],'rb').read(); out=open(sys.argv[2],'wb'); i=0\n"
      "while i < len(d):\n"
      "  j=d.index(b':',i); n=int(d[i:j]); s=d[j+1:j+1+n]; i=j+1+n\n"
      "  r=s.decode('utf-8','replace'); f=-1\n"
      "  try: s.decode('utf-8')\n"
      "  except UnicodeDecodeError as e: f=e.start\n"
      "  out.write(b'%d:%d:%d:' % (r.count('\\ufffd'), f, len(r.encode())) + r.encode())\n";
  WriteText(dir.File("ref.py"), script);
  ASSERT_EQ(std::system(("python3 " + dir.File("ref.py") + " " + dir.File("in.bin") + " " +
                         dir.File("out.bin")).c_str()),
            0);
  const std::vector<uint8_t> ref_bytes = ReadBytes(dir.File("out.bin"));
  const std::string ref(ref_bytes.begin(), ref_bytes.end());
  size_t at = 0;
  int64_t replaced_total = 0;
  for (const std::string& s : inputs) {
    const size_t c1 = ref.find(':', at), c2 = ref.find(':', c1 + 1), c3 = ref.find(':', c2 + 1);
    const int64_t want_count = std::stoll(ref.substr(at, c1 - at));
    const int64_t want_first = std::stoll(ref.substr(c1 + 1, c2 - c1 - 1));
    const size_t n = std::stoul(ref.substr(c2 + 1, c3 - c2 - 1));
    const std::string want = ref.substr(c3 + 1, n);
    at = c3 + 1 + n;
    std::string got;
    int64_t first = -1;
    const int64_t count = ReplaceInvalidUtf8(s, &got, &first);
    EXPECT_EQ(count, want_count) << "input bytes: " << ::testing::PrintToString(s);
    EXPECT_EQ(count > 0 ? got : s, want) << ::testing::PrintToString(s);
    if (count > 0) {
      EXPECT_EQ(first, want_first) << ::testing::PrintToString(s);
    }
    replaced_total += count;
  }
  EXPECT_GT(replaced_total, 1000);  // the inputs really were broken
  std::string out = "untouched";
  int64_t first = 5;
  EXPECT_EQ(ReplaceInvalidUtf8("valid \xC3\xA9", &out, &first), 0);
  EXPECT_EQ(out, "untouched");
  EXPECT_EQ(first, 5);
}

}  // namespace
}  // namespace ztrain::data
