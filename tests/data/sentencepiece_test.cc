// SentencePiece models through data/sentencepiece_tokenizer.h, and the tokenizer.json that
// transformers makes of them (byte_fallback BPE, data/hf_metaspace.h), against the
// sentencepiece library's Python binding on the same texts. The test trains its models with
// spm_train on a corpus it writes (English, code, CJK, accents), so characters of the texts
// (emoji, ZWJ sequences, combining marks, Arabic, Devanagari, tabs, newlines) are not in the
// vocabulary and take the byte fallback: a BPE and a unigram model with Llama-2's settings
// (identity normalization: decode(encode(x)) == x) and a BPE model with SentencePiece's
// default NFKC normalization. The BPE model is converted to tokenizer.json in both of the
// forms transformers writes (tests/reference/spm_to_tokenizer_json.py, after its
// LlamaConverter). Skipped without spm_train or a python3 that imports sentencepiece
// (Debian: sentencepiece, python3-sentencepiece).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/corpus.h"
#include "data/hf_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"
#include "tests/data/data_test_util.h"

namespace ztrain::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test_util::ExpectErrorWith;
using test_util::TempDir;

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

bool Succeeds(const std::string& cmd) {
  return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0;
}

// "" when `cmd` succeeds, else the command and the end of its output.
std::string Failure(const std::string& cmd, const std::string& log) {
  if (std::system((cmd + " >" + Quote(log) + " 2>&1").c_str()) == 0) return "";
  std::ifstream in(log);
  const std::string output{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return cmd + " failed: ..." + output.substr(output.size() - std::min<size_t>(output.size(), 600));
}

// An interpreter that imports sentencepiece (python3 may be a pyenv shim without Debian's
// packages), or "".
std::string SentencePiecePython() {
  for (const char* python : {"python3", "/usr/bin/python3"}) {
    if (Succeeds(std::string(python) + " -c 'import sentencepiece'")) return python;
  }
  return "";
}

const std::vector<std::string>& Texts() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> t = {
        "Hello world",
        "The quick brown fox jumps over the lazy dog. It's 3:45pm, isn't it?",
        "def train(model, data):\n    for step in range(10):\n\tloss = model(data)  # go\n",
        "   leading spaces, trailing spaces   \n\n  \t  mixed   whitespace\r\n",
        " one leading space",
        "Numbers: 1234567890 12,345.67 0x1F -42 ٣٤٥",
        "中文分词测试：今天天气很好。日本語のテキストも。한국어 문장입니다.",
        "Emoji: 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷",
        "Combining: e\xCC\x81, n\xCC\x83, Z\xCD\x91\xCD\x92"
        "algo, caf\xC3\xA9 vs cafe\xCC\x81",
        "Unseen: Ελληνικά Русский עברית العربية हिन्दी ﬁ ① ｶﾀｶﾅ",
        "",
        " ",
        "  ",
        "a",
        "\n",
    };
    std::string long_text, one_word;
    for (int i = 0; i < 200; ++i) long_text += "the model reads tokens 中文 ";
    for (int i = 0; i < 100; ++i) one_word += "trainingdata";
    t.push_back(long_text);
    t.push_back(one_word);
    return t;
  }();
  return texts;
}

// The training corpus: English and code with a few CJK and accented lines.
std::string Corpus() {
  const std::vector<std::string> words = {
      "the",    "model", "reads",   "tokens", "from",     "a",        "corpus", "and",
      "learns", "to",    "predict", "next",   "word",     "training", "data",   "loss",
      "step",   "quick", "brown",   "fox",    "jumps",    "over",     "lazy",   "dog",
      "it's",   "isn't", "we'll",   "3:45pm", "12,345.67"};
  std::string corpus;
  uint32_t state = 12345;
  const auto next = [&state](uint32_t n) {
    state = state * 1664525u + 1013904223u;
    return (state >> 8) % n;
  };
  for (int line = 0; line < 3000; ++line) {
    const uint32_t n = 3 + next(12);
    for (uint32_t w = 0; w < n; ++w) corpus += (w ? " " : "") + words[next(words.size())];
    corpus += "\n";
    if (line % 5 == 0) {
      corpus += "def f" + std::to_string(line) + "(x):\n    return x * " + std::to_string(line) +
                "  # comment\n";
    }
    if (line % 7 == 0) corpus += "中文分词测试今天天气很好 日本語のテキスト\n";
    if (line % 11 == 0) corpus += "café naïve résumé Ünïcödé\n";
  }
  return corpus;
}

class SentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    python_ = new std::string(SentencePiecePython());
    if (python_->empty()) return Skip("no python3 imports sentencepiece (python3-sentencepiece)");
    if (!Succeeds("spm_train --help")) return Skip("no spm_train (Debian's sentencepiece)");
    dir_ = new TempDir();
    std::ofstream(dir_->File("corpus.txt")) << Corpus();
    std::vector<std::string> texts = Texts();
    for (const std::string& t : Texts()) {  // what Metaspace encodes a leading space as
      if (!t.empty() && t[0] == ' ') texts.push_back(t.substr(1));
    }
    std::ofstream(dir_->File("texts.json")) << json(texts).dump();
    const std::string llama2 =
        " --normalization_rule_name=identity --remove_extra_whitespaces=false"
        " --split_digits=true --allow_whitespace_only_pieces=true";
    std::string failed;  // a unigram model of this small corpus has fewer than 500 pieces
    for (const auto& [name, flags] : std::vector<std::pair<std::string, std::string>>{
             {"bpe", "--model_type=bpe" + llama2},
             {"unigram", "--model_type=unigram --hard_vocab_limit=false" + llama2},
             {"bpe_nfkc", "--model_type=bpe"}}) {
      if (failed.empty()) failed = Train(name, flags);
    }
    for (const char* form : {"normalizer", "metaspace-first", "metaspace-always"}) {
      if (failed.empty()) failed = Convert(form);
    }
    ASSERT_EQ(failed, "");
  }
  static void TearDownTestSuite() {
    delete python_;
    delete dir_;
    delete skip_;
    python_ = nullptr;
    dir_ = nullptr;
    skip_ = nullptr;
  }
  void SetUp() override {
    if (skip_ != nullptr) GTEST_SKIP() << *skip_;
  }

  static void Skip(const std::string& why) { skip_ = new std::string(why); }

  static std::string Script() {
    return *python_ + " " + Quote(ZTRAIN_REFERENCE_DIR "/spm_to_tokenizer_json.py");
  }

  // Trains dir/<name>.model with byte fallback and writes the library's ids of the texts to
  // dir/<name>.ids.json; "" or what failed.
  static std::string Train(const std::string& name, const std::string& flags) {
    const std::string failed = Failure("spm_train --input=" + Quote(dir_->File("corpus.txt")) +
                                           " --model_prefix=" + Quote(dir_->File(name)) +
                                           " --vocab_size=500 --byte_fallback=true "
                                           "--character_coverage=0.9995 --num_threads=2 " +
                                           flags,
                                       dir_->File("log.txt"));
    if (!failed.empty()) return failed;
    return Failure(Script() + " encode " + Quote(dir_->File(name + ".model")) + " " +
                       Quote(dir_->File("texts.json")) + " " +
                       Quote(dir_->File(name + ".ids.json")),
                   dir_->File("log.txt"));
  }

  // dir/<form>.json: the BPE model as a tokenizer.json; "" or what failed.
  static std::string Convert(const std::string& form) {
    return Failure(Script() + " convert " + Quote(dir_->File("bpe.model")) + " " + form + " " +
                       Quote(dir_->File(form + ".json")),
                   dir_->File("log.txt"));
  }

  // The reference for `name`: {"ids": [...], "decoded": [...]}, one per texts.json entry.
  static json Reference(const std::string& name) {
    std::ifstream in(dir_->File(name + ".ids.json"));
    return json::parse(in);
  }

  // The index of `text` in texts.json.
  static size_t IndexOf(const std::string& text) {
    std::ifstream in(dir_->File("texts.json"));
    const auto all = json::parse(in).get<std::vector<std::string>>();
    return static_cast<size_t>(std::find(all.begin(), all.end(), text) - all.begin());
  }

  static std::string* python_;
  static TempDir* dir_;
  static std::string* skip_;
};
std::string* SentencePieceTest::python_ = nullptr;
TempDir* SentencePieceTest::dir_ = nullptr;
std::string* SentencePieceTest::skip_ = nullptr;

TEST_F(SentencePieceTest, IdsEqualTheLibraryAndDecodeBack) {
  for (const char* name : {"bpe", "unigram"}) {
    const SentencePieceTokenizer tok(dir_->File(std::string(name) + ".model"));
    const json reference = Reference(name);
    EXPECT_EQ(tok.vocab_size(), reference["vocab_size"].get<int64_t>());
    EXPECT_GT(tok.vocab_size(), 300);
    EXPECT_EQ(tok.kind(), std::string("SentencePiece ") + name + " model");
    const int32_t f0 = tok.TokenId("<0xF0>");
    int64_t byte_tokens = 0, tokens = 0;
    for (size_t i = 0; i < Texts().size(); ++i) {
      const std::vector<int32_t> ids = tok.Encode(Texts()[i]);
      EXPECT_EQ(ids, reference["ids"][i].get<std::vector<int32_t>>()) << name << ": " << Texts()[i];
      EXPECT_EQ(tok.Decode(ids), Texts()[i]) << name;
      for (const int32_t id : ids) byte_tokens += id == f0;
      tokens += static_cast<int64_t>(ids.size());
    }
    // Every emoji code point (outside the corpus) is 4 bytes from 0xF0: 10 of them.
    EXPECT_EQ(byte_tokens, 10) << name;
    EXPECT_GT(tokens, 1000);
  }
}

TEST_F(SentencePieceTest, NfkcModelEqualsTheLibrary) {
  const SentencePieceTokenizer tok(dir_->File("bpe_nfkc.model"));
  const json reference = Reference("bpe_nfkc");
  int changed = 0;
  for (size_t i = 0; i < Texts().size(); ++i) {
    const std::vector<int32_t> ids = tok.Encode(Texts()[i]);
    EXPECT_EQ(ids, reference["ids"][i].get<std::vector<int32_t>>()) << Texts()[i];
    const std::string decoded = tok.Decode(ids);
    EXPECT_EQ(decoded, reference["decoded"][i].get<std::string>()) << Texts()[i];
    changed += decoded != Texts()[i];
  }
  // NFKC and the removal of extra whitespace change the text (ﬁ, ①, ｶ, whitespace runs).
  EXPECT_GE(changed, 3);
}

// Llama-2's tokenizer.json form (normalizer Prepend + Replace) gives the library's ids.
TEST_F(SentencePieceTest, Llama2TokenizerJsonEqualsTheLibrary) {
  const HfTokenizer tok(dir_->File("normalizer.json"));
  const SentencePieceTokenizer sp(dir_->File("bpe.model"));
  EXPECT_EQ(tok.vocab_size(), 500);
  EXPECT_EQ(tok.kind(), "tokenizer.json BPE with byte fallback (Prepend/Replace normalizer)");
  const json reference = Reference("bpe");
  for (size_t i = 0; i < Texts().size(); ++i) {
    const std::vector<int32_t> ids = tok.Encode(Texts()[i]);
    EXPECT_EQ(ids, reference["ids"][i].get<std::vector<int32_t>>()) << Texts()[i];
    EXPECT_EQ(tok.Decode(ids), Texts()[i]);
  }
  // Added tokens are matched first, and each text between them gets the "▁" prefix (as the
  // `tokenizers` library normalizes each one), which Decode takes off again.
  const int32_t bos = tok.TokenId("<s>");
  EXPECT_EQ(bos, sp.bos_id());
  std::vector<int32_t> want = {bos};
  for (const int32_t id : tok.Encode("Hello world")) want.push_back(id);
  want.push_back(bos);
  for (const int32_t id : tok.Encode(" x")) want.push_back(id);
  EXPECT_EQ(tok.Encode("<s>Hello world<s> x"), want);
  EXPECT_EQ(tok.Decode(want), "<s>Hello world<s> x");
  const DocumentTokens d = ReadDocumentTokens(dir_->File("normalizer.json"), tok);
  EXPECT_EQ(d.before, std::vector<int32_t>{bos});
  EXPECT_EQ(d.source, "tokenizer.json post_processor");
}

// The Metaspace form (transformers' legacy=False): a text that starts with a space gets no
// second "▁", so it is encoded as SentencePiece encodes it without that space (and " " is
// the piece "▁", where SentencePiece gives "" nothing).
TEST_F(SentencePieceTest, MetaspaceTokenizerJsonEqualsTheLibrary) {
  const json reference = Reference("bpe");
  for (const char* form : {"metaspace-first", "metaspace-always"}) {
    const HfTokenizer tok(dir_->File(std::string(form) + ".json"));
    for (const std::string& text : Texts()) {
      const std::string as = !text.empty() && text[0] == ' ' ? text.substr(1) : text;
      const std::vector<int32_t> ids = tok.Encode(text);
      const std::vector<int32_t> want =
          text == " " ? std::vector<int32_t>{tok.TokenId("\xE2\x96\x81")}
                      : reference["ids"][IndexOf(as)].get<std::vector<int32_t>>();
      EXPECT_EQ(ids, want) << form << ": " << text;
      EXPECT_EQ(tok.Decode(ids), as) << form;
    }
    // "first" puts the "▁" only at the start of the input; "always" on each text between
    // added tokens; both decode back.
    const std::vector<int32_t> after_bos = tok.Encode("<s>Hello");
    const std::vector<int32_t> hello = tok.Encode("Hello");
    const bool prefixed = std::vector<int32_t>(after_bos.begin() + 1, after_bos.end()) == hello;
    EXPECT_EQ(prefixed, std::string(form) == "metaspace-always") << form;
    EXPECT_EQ(tok.Decode(after_bos), "<s>Hello") << form;
  }
}

TEST_F(SentencePieceTest, LoadTokenizerPicksTheReaderByFile) {
  const TempDir dirs;
  fs::create_directories(dirs.File("sp"));
  fs::create_directories(dirs.File("both"));
  fs::copy_file(dir_->File("bpe.model"), dirs.File("sp/tokenizer.model"));
  fs::copy_file(dir_->File("bpe.model"), dirs.File("both/tokenizer.model"));
  fs::copy_file(dir_->File("normalizer.json"), dirs.File("both/tokenizer.json"));
  const auto kind = [](const std::string& path) { return LoadTokenizer(path)->kind(); };
  EXPECT_EQ(kind(dir_->File("unigram.model")), "SentencePiece unigram model");
  EXPECT_EQ(kind(dirs.File("sp")), "SentencePiece bpe model");
  EXPECT_EQ(TokenizerFile(dirs.File("sp")), dirs.File("sp") + "/tokenizer.model");
  EXPECT_NE(kind(dirs.File("both")).find("tokenizer.json"), std::string::npos);
  EXPECT_EQ(TokenizerFile(dirs.File("both")), dirs.File("both") + "/tokenizer.json");
  EXPECT_NE(kind(dir_->File("normalizer.json")).find("tokenizer.json"), std::string::npos);
  EXPECT_EQ(kind(""), "byte");
  ExpectErrorWith<IoError>([&] { LoadTokenizer(dirs.path()); }, {"tokenizer.json"});
}

// Note [Document tokens]: the model's own BOS before each document, unless
// tokenizer_config.json beside it says otherwise; `ztrain data` writes them.
TEST_F(SentencePieceTest, DocumentsGetTheModelsBos) {
  const TempDir work;
  fs::create_directories(work.File("model"));
  const std::string model = work.File("model/tokenizer.model");
  fs::copy_file(dir_->File("bpe.model"), model);
  const SentencePieceTokenizer tok(model);
  const DocumentTokens d = ReadDocumentTokens(model, tok);
  EXPECT_EQ(d.before, std::vector<int32_t>{tok.bos_id()});
  EXPECT_TRUE(d.after.empty());
  EXPECT_EQ(d.layout, "<s> + text");
  EXPECT_NE(d.source.find("SentencePiece model's BOS"), std::string::npos);

  std::ofstream(work.File("docs.jsonl")) << json{{"text", "Hello world"}}.dump() << "\n"
                                         << json{{"text", "中文 👍🏽"}}.dump() << "\n";
  CorpusOptions o;
  o.inputs = {work.File("docs.jsonl")};
  o.out = work.File("out/c.bin");
  o.tokenizer = work.File("model");
  o.threads = 2;
  const CorpusReport r = TokenizeCorpus(o);
  std::vector<int32_t> want = {tok.bos_id()};
  for (const int32_t id : tok.Encode("Hello world")) want.push_back(id);
  want.push_back(tok.bos_id());
  for (const int32_t id : tok.Encode("中文 👍🏽")) want.push_back(id);
  const std::vector<uint32_t> got = TokenShard::Open(o.out).tokens().ToVector();
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), want);
  EXPECT_EQ(r.documents, 2);

  std::ofstream(work.File("model/tokenizer_config.json"))
      << R"({"add_bos_token": false, "add_eos_token": true, "eos_token": "</s>"})";
  const DocumentTokens c = ReadDocumentTokens(model, tok);
  EXPECT_TRUE(c.before.empty());
  EXPECT_EQ(c.after, std::vector<int32_t>{tok.eos_id()});
  EXPECT_EQ(c.layout, "text + </s>");
}

TEST_F(SentencePieceTest, UnsupportedFilesAndInputAreRefusedByName) {
  const TempDir work;
  std::ofstream(work.File("corrupt.model")) << "this is not a model proto";
  ExpectErrorWith<IoError>([&] { SentencePieceTokenizer t(work.File("corrupt.model")); },
                           {work.File("corrupt.model"), "SentencePiece"});
  ExpectErrorWith<IoError>([&] { LoadTokenizer(work.File("missing.model")); },
                           {work.File("missing.model")});
  const SentencePieceTokenizer sp(dir_->File("bpe.model"));
  EXPECT_EQ(sp.TokenId("no such piece"), -1);
  EXPECT_EQ(sp.TokenId("<unk>"), 0);
  EXPECT_THROW(sp.Encode("bad \xff byte"), Error);
  EXPECT_THROW(sp.Decode(std::vector<int32_t>{500}), Error);

  const auto refused = [&](const std::function<void(json&)>& edit,
                           const std::vector<std::string>& parts) {
    std::ifstream in(dir_->File("normalizer.json"));
    json j = json::parse(in);
    edit(j);
    std::ofstream(work.File("edited.json")) << j.dump();
    ExpectErrorWith<ConfigError>([&] { HfTokenizer t(work.File("edited.json")); }, parts);
  };
  refused([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, {"normalizer 'Lowercase'"});
  refused(
      [](json& j) {
        j["normalizer"]["normalizers"].push_back({{"type", "NFKC"}});
      },
      {"normalizer 'NFKC'", "Prepend"});
  refused([](json& j) { j["normalizer"]["normalizers"].erase(1); }, {"does not replace"});
  refused(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Whitespace"}};
      },
      {"pre_tokenizer 'Whitespace'"});
  refused(
      [](json& j) {
        j["normalizer"] = nullptr;
        j["pre_tokenizer"] = {{"type", "ByteLevel"}};
      },
      {"byte_fallback", "pre_tokenizer is 'ByteLevel'", "Metaspace"});
  refused(
      [](json& j) {
        j["normalizer"] = nullptr;
        j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
      },
      {"Metaspace replacement '_'"});
  refused([](json& j) { j["model"]["vocab"].erase("<0x41>"); }, {"<0x41>", "all 256"});
  refused([](json& j) { j["added_tokens"][1]["normalized"] = true; }, {"<s>", "normalized"});
  refused([](json& j) { j["model"]["type"] = "Unigram"; }, {"model.type is 'Unigram'"});
}

}  // namespace
}  // namespace ztrain::data
