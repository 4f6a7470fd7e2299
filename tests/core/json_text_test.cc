// JSON from users' files (core/json_text.h): a syntax error is named by line and column, a
// file that ends early is called truncated, a binary or empty file says so, not the parser's
// byte dump.
#include "core/json_text.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "tests/expect_error.h"

namespace ztrain {
namespace {

using testing::ExpectErrorWith;

TEST(JsonTextTest, ProblemsAreSaidInWords) {
  nlohmann::json j;
  EXPECT_EQ(ParseJson("{\"a\": [1, 2]}", &j), "");
  EXPECT_EQ(j["a"][1], 2);
  const std::string truncated = ParseJson("{\n  \"model\": {\"n_layer\": 2,\n", &j);
  EXPECT_NE(truncated.find("3:1: JSON syntax error"), std::string::npos) << truncated;
  EXPECT_NE(truncated.find("truncated?"), std::string::npos) << truncated;
  EXPECT_TRUE(j.is_null());
  const std::string comma = ParseJson("{\"a\": 1,, \"b\": 2}\n", &j);
  EXPECT_NE(comma.find("1:9: JSON syntax error"), std::string::npos) << comma;
  EXPECT_EQ(comma.find("truncated"), std::string::npos) << comma;
  EXPECT_EQ(ParseJson(std::string("PK\x03\x04\0\0weights", 12), &j), "is a binary file, not JSON");
  EXPECT_EQ(ParseJson(" \n", &j), "is empty, not JSON");
}

TEST(JsonTextTest, ParseJsonOrThrowNamesTheFile) {
  ExpectErrorWith<IoError>(
      [] { ParseJsonOrThrow<IoError>("{\"x\": tru}", "tokenizer tok/tokenizer.json"); },
      {"tokenizer tok/tokenizer.json:1:"});
  ExpectErrorWith<ConfigError>(
      [] { ParseJsonOrThrow<ConfigError>(std::string("\x7f" "ELF\x02\x01\x01\0", 8), "config file z"); },
      {"config file z is a binary file, not JSON"});
}

}  // namespace
}  // namespace ztrain
