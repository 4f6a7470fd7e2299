#pragma once
// `ztrain data`: a corpus of text and JSONL files to llm.c token shards, and back.
//
// Inputs are files, globs and directories (every file under them but hidden ones, sorted by
// path). A file ending .jsonl or .ndjson is JSON Lines (one document per non-blank line, its
// `jsonl_key` field); any other file is one document of text. Each document gets the
// tokenizer's document tokens (Note [Document tokens], data/tokenizer.h).
//
// Invalid UTF-8 is replaced as Python's bytes.decode("utf-8", errors="replace") replaces it
// (each maximal invalid subsequence becomes U+FFFD); the report counts the replacements and
// names the first. `invalid_utf8 = "error"` refuses such input instead.
//
// Note [Corpus shards]: tokens fill shards of `shard_tokens` in document order (a document
// may continue into the next shard, as llm.c's do). When every token fits one shard it is
// `out` itself; otherwise `out`'s stem plus _000000.bin, _000001.bin, ... (data.train
// "stem_*.bin" reads them in order). With `val_tokens`, whole documents from the start of the
// corpus go to the validation split until it holds at least that many tokens; it is written
// as `out`'s stem plus ".val.bin" (or .val_000000.bin, ...), which the train glob does not
// match. A manifest (`stem.manifest.json`) lists the inputs, shards, counts and the
// tokenizer's SHA-256.
//
// Memory is bounded whatever the corpus size: documents are read and encoded a batch at a
// time (about threads x 4 MiB of text; the next batch is read on its own thread while one is
// encoded), and at most one shard of tokens is buffered per split. Encoding runs on `threads`
// threads; the output is the same bytes whatever their
// number (documents keep their order). The shards and manifest are written into a staging
// directory beside `out` and put in place together only when the whole corpus succeeded (Note
// [Staged file sets], core/staged_output.h): a failure or a kill leaves the earlier corpus as
// it was, or the new one whole; its files that the new corpus does not replace (numbered
// shards beyond the new count) are removed with the commit.
//
// Failures: IoError (files), ConfigError (options, inputs that are not what they should be),
// both naming the file and, for JSONL, the line.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "data/token_format.h"
#include "data/tokenizer.h"

namespace ztrain::data {

// Shards of 100M tokens, as llm.c's fineweb.py writes them.
inline constexpr int64_t kDefaultShardTokens = 100'000'000;

// What a progress callback is told, about once a second.
struct CorpusProgress {
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
  int64_t documents = 0;
  int64_t tokens = 0;
  double seconds = 0;
};

struct CorpusOptions {
  std::vector<std::string> inputs;     // files, globs, directories
  std::string out;                     // the shard path (.bin)
  std::string tokenizer;               // tokenizer.json, its directory, or "" (byte tokens)
  std::string token_format = "auto";   // auto, uint16 or uint32
  std::string input_format = "auto";   // auto (by extension), text or jsonl
  std::string jsonl_key = "text";
  std::string bos = "auto";            // Note [Document tokens]
  std::string eos = "auto";
  std::string invalid_utf8 = "replace";  // or "error"
  int64_t shard_tokens = kDefaultShardTokens;
  int64_t val_tokens = 0;
  int threads = 0;  // 0: every core
  // Replace an earlier corpus at `out` (its shards, manifest); without it one is refused.
  bool overwrite = false;
  // Tokenize inputs that look binary (a NUL byte in their first 64 KiB); refused otherwise.
  bool allow_binary = false;
  std::function<void(const CorpusProgress&)> on_progress;
};

struct ShardFile {
  std::string path;
  int64_t tokens = 0;
  bool val = false;
};

struct CorpusReport {
  std::vector<ShardFile> shards;
  std::string manifest;
  TokenFormat format = TokenFormat::kUint16;
  int64_t vocab_size = 0;
  DocumentTokens document_tokens;
  int64_t files = 0;
  int64_t bytes = 0;
  int64_t documents = 0;
  int64_t tokens = 0;  // train and val
  int64_t val_documents = 0;
  int64_t val_tokens = 0;
  int64_t invalid_utf8 = 0;    // replacements
  std::string first_invalid;   // "file:line byte offset N" of the first, or ""
  std::vector<std::string> removed;  // files of the earlier corpus at --out this one does not replace
  double seconds = 0;
};

CorpusReport TokenizeCorpus(const CorpusOptions& options);

// The input files `inputs` name (files, globs, directories), in order. IoError for one that
// names nothing.
std::vector<std::string> ExpandInputs(const std::vector<std::string>& inputs);

// Writes the text of the shard at `shard_path` to `out`, decoded with `tokenizer`; returns
// the token count.
int64_t DecodeShard(const std::string& shard_path, const Tokenizer& tokenizer, std::FILE* out);

}  // namespace ztrain::data
