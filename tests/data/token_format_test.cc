#include "data/token_format.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"
#include "tests/data/data_test_util.h"

namespace ztrain::data {
namespace {

using test_util::ExpectErrorWith;

// Note [Token format by vocabulary]: GPT-2's 50,257 ids and any vocabulary up to 65,536 ids
// (0..65,535) are uint16; one id more, or Llama-3's 128,256, is uint32.
TEST(TokenFormatTest, TheVocabularyPicksTheWidth) {
  EXPECT_EQ(TokenFormatForVocabulary(1), TokenFormat::kUint16);
  EXPECT_EQ(TokenFormatForVocabulary(256), TokenFormat::kUint16);
  EXPECT_EQ(TokenFormatForVocabulary(50'257), TokenFormat::kUint16);
  EXPECT_EQ(TokenFormatForVocabulary(65'536), TokenFormat::kUint16);
  EXPECT_EQ(TokenFormatForVocabulary(65'537), TokenFormat::kUint32);
  EXPECT_EQ(TokenFormatForVocabulary(128'256), TokenFormat::kUint32);
  EXPECT_STREQ(TokenFormatName(TokenFormat::kUint16), "uint16");
  EXPECT_STREQ(TokenFormatName(TokenFormat::kUint32), "uint32");
  EXPECT_EQ(TokenBytes(TokenFormat::kUint16), 2);
  EXPECT_EQ(TokenBytes(TokenFormat::kUint32), 4);
}

TEST(TokenFormatTest, TheUsersChoiceOverridesAutoWhereTheIdsFit) {
  EXPECT_EQ(ChooseTokenFormat("auto", 256, "--token-format"), TokenFormat::kUint16);
  EXPECT_EQ(ChooseTokenFormat("auto", 128'256, "--token-format"), TokenFormat::kUint32);
  EXPECT_EQ(ChooseTokenFormat("uint32", 256, "--token-format"), TokenFormat::kUint32);
  EXPECT_EQ(ChooseTokenFormat("uint16", 65'536, "--token-format"), TokenFormat::kUint16);
  ExpectErrorWith<ConfigError>([] { ChooseTokenFormat("uint16", 128'256, "--token-format"); },
                               {"--token-format uint16 cannot hold", "128256 ids", "below 65536",
                                "use --token-format uint32"});
  ExpectErrorWith<ConfigError>([] { ChooseTokenFormat("int8", 256, "--token-format"); },
                               {"--token-format must be auto, uint16 or uint32", "'int8'"});
}

TEST(TokenSpanTest, WidensEitherWidth) {
  const std::vector<uint16_t> narrow = {1, 65535, 7};
  const std::vector<uint32_t> wide = {1, 65536, 128255};
  const TokenSpan a(narrow), b(wide);
  EXPECT_EQ(a.format(), TokenFormat::kUint16);
  EXPECT_EQ(b.format(), TokenFormat::kUint32);
  EXPECT_EQ(a[1], 65535u);
  EXPECT_EQ(b[2], 128255u);
  EXPECT_EQ(a.ToVector(), (std::vector<uint32_t>{1, 65535, 7}));
  EXPECT_EQ(b.ToVector(), wide);
  EXPECT_EQ(b.Visit([](auto t) { return sizeof(t[0]); }), 4u);
  EXPECT_EQ(a.As<uint16_t>().data(), narrow.data());
  EXPECT_THROW(a.As<uint32_t>(), InternalError);
  EXPECT_TRUE(TokenSpan().empty());
}

}  // namespace
}  // namespace ztrain::data
