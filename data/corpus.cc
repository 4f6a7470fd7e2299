#include "data/corpus.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/logging.h"
#include "core/staged_output.h"
#include "core/sha256.h"
#include "data/byte_tokenizer.h"
#include "data/token_shard.h"

namespace ztrain::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::ztrain::detail::StrCat;

// Text per thread in one batch, and the piece size byte tokens split long files into.
constexpr size_t kBatchBytesPerThread = size_t{4} << 20;
constexpr size_t kMaxBatchDocuments = 65536;
constexpr const char* kPartial = ".partial";

std::string Stem(const std::string& out) {
  return out.size() >= 4 && out.compare(out.size() - 4, 4, ".bin") == 0
             ? out.substr(0, out.size() - 4)
             : out;
}

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Whether `path` is JSON Lines under the --input-format choice.
bool IsJsonl(const std::string& path, const std::string& input_format) {
  for (const char* packed : {".gz", ".zst", ".bz2", ".xz", ".parquet", ".arrow"}) {
    ZTRAIN_CHECK_T(ConfigError, !EndsWith(path, packed), "input '", path, "' is a ", packed + 1,
                   " file; ztrain reads text and JSONL: ",
                   std::string(packed) == ".parquet" || std::string(packed) == ".arrow"
                       ? "convert it to JSONL first"
                       : "decompress it first");
  }
  if (input_format != "auto") return input_format == "jsonl";
  return EndsWith(path, ".jsonl") || EndsWith(path, ".ndjson");
}

// A run of text to encode: a document or, for byte tokens, part of one.
struct Piece {
  std::string text;
  bool starts_document = true;
  bool ends_document = true;
  size_t file = 0;   // index into the input files
  int64_t line = 0;  // JSONL: the line; text: 0
  int64_t invalid = 0;         // invalid UTF-8 sequences replaced in it
  int64_t first_invalid = -1;  // the offset of the first in the line or piece
};

// "file" or "file:line", for messages.
std::string Where(const Piece& piece, const std::vector<std::string>& files) {
  return piece.line > 0 ? StrCat(files[piece.file], ":", piece.line) : files[piece.file];
}

// Reads the inputs' documents in order, a batch at a time.
class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> files, const CorpusOptions& options,
                 bool split_text)
      : files_(std::move(files)), options_(options), split_text_(split_text) {}

  // The next batch (empty at the end).
  std::vector<Piece> NextBatch(size_t max_bytes) {
    std::vector<Piece> batch;
    size_t bytes = 0;
    while (bytes < max_bytes && batch.size() < kMaxBatchDocuments && Next(batch)) {
      bytes += batch.back().text.size();
    }
    return batch;
  }

  // Safe to call while another thread reads a batch.
  int64_t bytes_read() const { return bytes_read_.load(); }

 private:
  // Appends the next piece; false at the end of the inputs.
  bool Next(std::vector<Piece>& batch) {
    while (true) {
      if (!in_.is_open()) {
        if (next_file_ == files_.size()) return false;
        Open(files_[next_file_++]);
      }
      if (jsonl_ ? NextLine(batch) : NextText(batch)) return true;
      in_.close();
    }
  }

  void Open(const std::string& path) {
    path_ = path;
    jsonl_ = IsJsonl(path, options_.input_format);
    line_ = 0;
    in_.open(path, std::ios::binary);
    ZTRAIN_CHECK_T(IoError, in_.is_open(), "cannot open input '", path, "'");
    text_started_ = false;
    file_offset_ = 0;
  }

  bool NextLine(std::vector<Piece>& batch) {
    std::string line;
    while (std::getline(in_, line)) {
      ++line_;
      bytes_read_ += static_cast<int64_t>(line.size()) + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      Piece piece{.text = {}, .file = next_file_ - 1, .line = line_};
      Repair(line, piece);
      piece.text = DocumentText(line);
      batch.push_back(std::move(piece));
      return true;
    }
    ZTRAIN_CHECK_T(IoError, in_.eof(), "cannot read input '", path_, "'");
    return false;
  }

  // The `jsonl_key` string of one JSON line.
  std::string DocumentText(const std::string& line) const {
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw ConfigError(StrCat(path_, ":", line_, ": not a JSON line (", e.what(),
                               "); JSONL holds one JSON object per line"));
    }
    const std::string& key = options_.jsonl_key;
    if (j.is_object() && j.contains(key) && j[key].is_string()) return j[key].get<std::string>();
    std::string keys;
    if (j.is_object()) {
      for (const auto& [k, v] : j.items()) keys += (keys.empty() ? "" : ", ") + k;
    }
    throw ConfigError(StrCat(
        path_, ":", line_, ": ",
        !j.is_object()  ? "the line is no JSON object"
        : j.contains(key) ? StrCat("\"", key, "\" is ", j[key].type_name(), ", not a string")
                          : StrCat("no \"", key, "\" field (it has: ", keys, ")"),
        "; --jsonl-key names the field that holds each document's text"));
  }

  // A text file: one document, read whole, or in pieces cut at code point boundaries when
  // the tokenizer splits anywhere (byte tokens).
  bool NextText(std::vector<Piece>& batch) {
    if (!split_text_) {
      if (text_started_) return false;
      text_started_ = true;
      std::string text(fs::file_size(path_), '\0');
      in_.read(text.data(), static_cast<std::streamsize>(text.size()));
      ZTRAIN_CHECK_T(IoError, in_.gcount() == static_cast<std::streamsize>(text.size()),
                     "cannot read input '", path_, "'");
      bytes_read_ += static_cast<int64_t>(text.size());
      Piece piece{.text = {}, .file = next_file_ - 1};
      Repair(text, piece);
      piece.text = std::move(text);
      batch.push_back(std::move(piece));
      return true;
    }
    std::string text(kBatchBytesPerThread + 3, '\0');
    in_.read(text.data(), static_cast<std::streamsize>(kBatchBytesPerThread));
    ZTRAIN_CHECK_T(IoError, !in_.bad(), "cannot read input '", path_, "'");
    size_t n = static_cast<size_t>(in_.gcount());
    if (n == 0 && text_started_) return false;
    // Finish the code point the read cut (up to 3 continuation bytes).
    while (n > 0 && in_.good() && (static_cast<unsigned char>(in_.peek()) & 0xC0) == 0x80 &&
           n < text.size()) {
      text[n++] = static_cast<char>(in_.get());
    }
    text.resize(n);
    bytes_read_ += static_cast<int64_t>(n);
    const int64_t offset = file_offset_;
    file_offset_ += static_cast<int64_t>(n);
    const bool first = !text_started_;
    text_started_ = true;
    const bool last = in_.peek() == std::char_traits<char>::eof();
    Piece piece{.text = {}, .starts_document = first, .ends_document = last, .file = next_file_ - 1};
    Repair(text, piece, offset);
    piece.text = std::move(text);
    batch.push_back(std::move(piece));
    if (last) in_.clear();
    return true;
  }

  // Applies the invalid UTF-8 policy to `text` (a JSONL line before it is parsed, as Python's
  // open(errors="replace") would read it).
  // `offset`: where `text` starts in its file (text read in pieces).
  void Repair(std::string& text, Piece& piece, int64_t offset = 0) const {
    std::string repaired;
    piece.invalid = ReplaceInvalidUtf8(text, &repaired, &piece.first_invalid);
    if (piece.invalid == 0) return;
    piece.first_invalid += offset;
    ZTRAIN_CHECK_T(ConfigError, options_.invalid_utf8 != "error", path_,
                   piece.line > 0 ? StrCat(":", piece.line) : std::string(),
                   ": not valid UTF-8 at byte ", piece.first_invalid,
                   piece.line > 0 ? " of the line" : "",
                   "; convert the file (iconv -t UTF-8) or pass --invalid-utf8 replace");
    text = std::move(repaired);
  }

  std::vector<std::string> files_;
  const CorpusOptions& options_;
  bool split_text_;
  size_t next_file_ = 0;
  std::ifstream in_;
  std::string path_;
  bool jsonl_ = false;
  bool text_started_ = false;
  int64_t line_ = 0;
  int64_t file_offset_ = 0;  // bytes of the current text file read so far
  std::atomic<int64_t> bytes_read_{0};
};

// Tokens fill shards of `shard_tokens` (Note [Corpus shards]), written into the corpus's
// staging directory (Note [Staged file sets], core/staged_output.h).
class ShardSink {
 public:
  ShardSink(StagedFileSet& staged, std::string out, int64_t shard_tokens, TokenFormat format,
            bool val)
      : staged_(staged), out_(std::move(out)), shard_tokens_(shard_tokens), format_(format),
        val_(val) {}

  void Append(std::span<const int32_t> tokens) {
    while (!tokens.empty()) {
      if (static_cast<int64_t>(buffer_.size()) == shard_tokens_) Flush(SplitShardPath(out_, index_));
      const size_t take = std::min(tokens.size(), static_cast<size_t>(shard_tokens_) - buffer_.size());
      // Token ids are never negative (the tokenizers' vocabularies start at 0).
      buffer_.insert(buffer_.end(), tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(take));
      tokens = tokens.subspan(take);
      tokens_ += static_cast<int64_t>(take);
    }
  }

  // Writes what is buffered: `out` itself when it is the only shard.
  void Finish() {
    if (buffer_.empty()) return;
    Flush(index_ == 0 ? out_ : SplitShardPath(out_, index_));
  }

  int64_t tokens() const { return tokens_; }
  const std::vector<ShardFile>& files() const { return files_; }

 private:
  void Flush(const std::string& path) {
    WriteTokenShard(staged_.PathOf(fs::path(path).filename().string()), TokenSpan(buffer_),
                    format_);
    files_.push_back(ShardFile{path, static_cast<int64_t>(buffer_.size()), val_});
    buffer_.clear();
    ++index_;
  }

  StagedFileSet& staged_;
  std::string out_;
  int64_t shard_tokens_;
  TokenFormat format_;
  bool val_;
  std::vector<uint32_t> buffer_;  // the shard being filled, written as it is
  std::vector<ShardFile> files_;
  int64_t index_ = 0;
  int64_t tokens_ = 0;
};

std::vector<int32_t> EncodePiece(const Piece& piece, const Tokenizer& tokenizer,
                                 const DocumentTokens& doc) {
  std::vector<int32_t> tokens;
  if (piece.starts_document) tokens = doc.before;
  const std::vector<int32_t> body = tokenizer.Encode(piece.text);
  tokens.insert(tokens.end(), body.begin(), body.end());
  if (piece.ends_document) tokens.insert(tokens.end(), doc.after.begin(), doc.after.end());
  return tokens;
}

// Encodes `batch` on `threads` threads (each piece on one; the results keep the order).
std::vector<std::vector<int32_t>> EncodeBatch(const std::vector<Piece>& batch,
                                              const Tokenizer& tokenizer,
                                              const DocumentTokens& doc, int threads) {
  std::vector<std::vector<int32_t>> out(batch.size());
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (size_t i = next++; i < batch.size() && !failed; i = next++) {
      try {
        out[i] = EncodePiece(batch[i], tokenizer, doc);
      } catch (...) {
        if (!failed.exchange(true)) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> helpers;
  const int n = std::min<int>(threads, static_cast<int>(batch.size()));
  for (int t = 1; t < n; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& t : helpers) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

// Why the start of `file` is binary rather than text ("" when it is not): a NUL byte in the
// first 64 KiB, which no text or JSONL file holds (UTF-16 text has them too: convert it).
std::string WhyBinary(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  std::string head(64 << 10, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  const size_t nul = head.find('\0');
  if (nul == std::string::npos) return "";
  if (head.rfind("\x7f"
                 "ELF",
                 0) == 0)
    return "an ELF executable or library";
  if (head.rfind("PK\x03\x04", 0) == 0) return "a zip archive";
  return StrCat("a NUL byte at offset ", nul,
                " (a binary file, or UTF-16 text: convert it to "
                "UTF-8)");
}

// Whether `rest` is "_" and six or more digits and ".bin": a numbered shard's suffix.
bool IsShardNumber(std::string_view rest) {
  if (rest.size() < 11 || rest[0] != '_' || !rest.ends_with(".bin")) return false;
  const std::string_view digits = rest.substr(1, rest.size() - 5);
  return std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Whether a file named `name` in --out's directory is one a corpus at `out` consists of (Note
// [Corpus shards]): its shard, numbered shards, validation shards or manifest.
bool IsCorpusFile(const std::string& name, const std::string& out) {
  if (name == fs::path(out).filename().string()) return true;  // also when it lacks ".bin"
  const std::string stem = fs::path(Stem(out)).filename().string();
  if (name.rfind(stem, 0) != 0) return false;
  const std::string_view rest = std::string_view(name).substr(stem.size());
  return rest == ".bin" || rest == ".manifest.json" || rest == ".val.bin" || IsShardNumber(rest) ||
         (rest.starts_with(".val") && IsShardNumber(rest.substr(4)));
}

// Whether `file` is, or could be, one of the files written for `out`.
bool IsOutputOf(const std::string& file, const std::string& out) {
  std::error_code ec;
  if (fs::equivalent(file, out, ec)) return true;
  const fs::path f = fs::weakly_canonical(fs::absolute(file), ec);
  const fs::path dir = fs::weakly_canonical(fs::absolute(out).parent_path(), ec);
  return f.parent_path() == dir && IsCorpusFile(f.filename().string(), out);
}

void CheckOptions(const CorpusOptions& o, const std::vector<std::string>& files) {
  ZTRAIN_CHECK_T(ConfigError, !o.out.empty(), "--out names the shard to write, e.g. corpus.bin");
  ZTRAIN_CHECK_T(ConfigError, !fs::is_directory(o.out), "--out '", o.out,
                 "' is a directory; give the shard a file name, e.g. '",
                 (fs::path(o.out) / "data.bin").string(), "'");
  ZTRAIN_CHECK_T(ConfigError, o.shard_tokens >= 1 && o.shard_tokens <= INT32_MAX,
                 "--shard-tokens must be in [1, ", INT32_MAX, "] (llm.c's header holds an "
                 "int32 count), got ", o.shard_tokens);
  ZTRAIN_CHECK_T(ConfigError, o.val_tokens >= 0, "--val-tokens must be >= 0, got ",
                 o.val_tokens);
  ZTRAIN_CHECK_T(ConfigError, o.invalid_utf8 == "replace" || o.invalid_utf8 == "error",
                 "--invalid-utf8 is 'replace' or 'error', got '", o.invalid_utf8, "'");
  ZTRAIN_CHECK_T(ConfigError,
                 o.input_format == "auto" || o.input_format == "text" || o.input_format == "jsonl",
                 "--input-format is auto, text or jsonl, got '", o.input_format, "'");
  // Never overwrite an input: a shard written over it would replace it; nor write into the
  // tokenizer's directory or an input directory (by identity: core/staged_output.h).
  const std::string stem = Stem(o.out);
  for (const std::string& f : files) {
    ZTRAIN_CHECK_T(ConfigError, !IsOutputOf(f, o.out), "--out '", o.out,
                   "' would write over the input '", f,
                   "', which this command reads; give --out another name, e.g. '",
                   stem + ".tokens.bin", "'");
  }
  if (!o.allow_binary) {
    for (const std::string& f : files) {
      const std::string why = WhyBinary(f);
      ZTRAIN_CHECK_T(ConfigError, why.empty(), "input '", f, "' is not text: ", why,
                     ". ztrain data reads text and JSONL files; give --allow-binary to "
                     "tokenize its bytes anyway");
    }
  }
  std::vector<NamedInput> inputs = {{"--tokenizer", o.tokenizer}};
  std::error_code ec;
  for (const std::string& in : o.inputs) {
    if (fs::is_directory(in, ec)) inputs.push_back({"the input directory", in});
  }
  CheckOutputIsNoInput(o.out, "--out", inputs);
}

// An earlier corpus at --out is replaced only when asked.
void CheckNoEarlierCorpus(const CorpusOptions& o) {
  if (o.overwrite) return;
  const fs::path dir = fs::absolute(o.out).parent_path();
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    ZTRAIN_CHECK_T(ConfigError, !IsCorpusFile(e.path().filename().string(), o.out), "--out '",
                   o.out, "': '", e.path().string(),
                   "' is there from an earlier run; nothing is overwritten unless asked: give "
                   "--overwrite to replace that corpus (its shards and manifest), or choose "
                   "another --out");
  }
}

// Removes the shards (".partial") that ztrain versions before Note [Staged file sets] staged
// beside `out` in a run that did not finish.
void RemovePartialShards(const std::string& out) {
  const fs::path stem = fs::absolute(Stem(out));
  const fs::path dir = stem.parent_path();
  const std::string prefix = stem.filename().string();
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !EndsWith(name, kPartial)) continue;
    std::error_code rm;
    fs::remove(e.path(), rm);
    Log().info("removed {}, a shard staged by an earlier run that did not finish",
               e.path().string());
  }
}

// The manifest: what was read, with what, and what was written.
json Manifest(const CorpusOptions& o, const CorpusReport& r, const Tokenizer& tokenizer,
              const std::vector<std::string>& files, const std::vector<int64_t>& documents) {
  json tok = {{"kind", tokenizer.kind()}, {"vocab_size", r.vocab_size}};
  if (!o.tokenizer.empty()) {
    const fs::path file = TokenizerFile(o.tokenizer);
    tok["path"] = file.string();
    tok["sha256"] = Sha256File(file.string());
  }
  tok["document_tokens"] = {{"before", r.document_tokens.before},
                            {"after", r.document_tokens.after},
                            {"rule", r.document_tokens.source}};
  json inputs = json::array();
  for (size_t i = 0; i < files.size(); ++i) {
    inputs.push_back({{"path", files[i]}, {"documents", documents[i]}});
  }
  json shards = json::array();
  for (const ShardFile& s : r.shards) {
    shards.push_back({{"path", fs::path(s.path).filename().string()},
                      {"tokens", s.tokens},
                      {"split", s.val ? "val" : "train"}});
  }
  return {{"format", TokenFormatName(r.format)},
          {"tokenizer", tok},
          {"inputs", inputs},
          {"shards", shards},
          {"documents", r.documents},
          {"tokens", r.tokens},
          {"val_documents", r.val_documents},
          {"val_tokens", r.val_tokens},
          {"bytes", r.bytes},
          {"invalid_utf8_replaced", r.invalid_utf8}};
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.flush();
  ZTRAIN_CHECK_T(IoError, f.good(), "cannot write '", path, "'");
}

}  // namespace

std::vector<std::string> ExpandInputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (in.find_first_of("*?[") != std::string::npos) {
      for (const std::string& f :
           ExpandGlob(in, "ztrain data reads files, directories and globs such as "
                          "'texts/*.jsonl'")) {
        if (!fs::is_directory(f, ec)) files.push_back(f);
      }
    } else if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(in)) {
        const std::string name = e.path().filename().string();
        const bool hidden = name.empty() || name[0] == '.';
        if (e.is_regular_file() && !hidden) found.push_back(e.path().string());
      }
      ZTRAIN_CHECK_T(IoError, !found.empty(), "input directory '", in, "' holds no files");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      ZTRAIN_CHECK_T(IoError, fs::is_regular_file(in, ec), "input '", in,
                     "' does not exist (give text or JSONL files, globs or directories)");
      files.push_back(in);
    }
  }
  ZTRAIN_CHECK_T(ConfigError, !files.empty(), "no input files: give text or JSONL files, globs "
                 "or directories");
  return files;
}

CorpusReport TokenizeCorpus(const CorpusOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> files = ExpandInputs(o.inputs);
  CheckOptions(o, files);
  const std::unique_ptr<Tokenizer> tokenizer = LoadTokenizer(o.tokenizer);
  CorpusReport r;
  r.vocab_size = tokenizer->vocab_size();
  r.format = ChooseTokenFormat(o.token_format, r.vocab_size, "--token-format");
  r.document_tokens = ReadDocumentTokens(o.tokenizer, *tokenizer, o.bos, o.eos);
  r.files = static_cast<int64_t>(files.size());
  int64_t total_bytes = 0;
  for (const std::string& f : files) total_bytes += static_cast<int64_t>(fs::file_size(f));
  const int threads =
      o.threads > 0 ? o.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));

  const std::string stem = Stem(o.out);
  // Finishes a killed run's commit first, so that the corpus judged below is a whole one.
  StagedFileSet staged(o.out, [&o](const std::string& name) { return IsCorpusFile(name, o.out); },
                       "--out");
  CheckNoEarlierCorpus(o);
  RemovePartialShards(o.out);
  ShardSink train(staged, o.out, o.shard_tokens, r.format, false);
  ShardSink val(staged, stem + ".val.bin", o.shard_tokens, r.format, true);
  std::vector<int64_t> documents(files.size(), 0);
  DocumentReader reader(files, o, tokenizer->splits_anywhere());
  bool to_val = false;  // the current document's split
  auto last_report = start;
  // The next batch is read (and its JSON parsed) on its own thread while this one is encoded.
  const auto read = [&reader, threads] { return reader.NextBatch(kBatchBytesPerThread * threads); };
  std::future<std::vector<Piece>> next = std::async(std::launch::async, read);
  for (std::vector<Piece> batch = next.get(); !batch.empty(); batch = next.get()) {
    next = std::async(std::launch::async, read);
    const std::vector<std::vector<int32_t>> encoded =
        EncodeBatch(batch, *tokenizer, r.document_tokens, threads);
    for (size_t i = 0; i < batch.size(); ++i) {
      const Piece& piece = batch[i];
      if (piece.starts_document) {
        to_val = val.tokens() < o.val_tokens;
        ++r.documents;
        r.val_documents += to_val ? 1 : 0;
        ++documents[piece.file];
      }
      if (piece.invalid > 0 && r.invalid_utf8 == 0) {
        r.first_invalid = StrCat(Where(piece, files), " byte ", piece.first_invalid);
      }
      r.invalid_utf8 += piece.invalid;
      (to_val ? val : train).Append(encoded[i]);
    }
    const auto now = std::chrono::steady_clock::now();
    if (o.on_progress && now - last_report >= std::chrono::seconds(1)) {
      last_report = now;
      o.on_progress(CorpusProgress{reader.bytes_read(), total_bytes, r.documents,
                                   train.tokens() + val.tokens(),
                                   std::chrono::duration<double>(now - start).count()});
    }
  }
  ZTRAIN_CHECK_T(ConfigError, train.tokens() + val.tokens() > 0,
                 "the inputs hold no text: nothing to write");
  ZTRAIN_CHECK_T(ConfigError, train.tokens() > 0, "--val-tokens ", o.val_tokens,
                 " takes the whole corpus (", val.tokens(),
                 " tokens) for validation and leaves none to train on; give fewer");
  train.Finish();
  val.Finish();
  r.shards = val.files();
  r.shards.insert(r.shards.end(), train.files().begin(), train.files().end());
  r.tokens = train.tokens() + val.tokens();
  r.val_tokens = val.tokens();
  r.bytes = reader.bytes_read();
  r.manifest = stem + ".manifest.json";
  const std::string manifest_name = fs::path(r.manifest).filename().string();
  WriteText(staged.PathOf(manifest_name), Manifest(o, r, *tokenizer, files, documents).dump(2) + "\n");
  // Shards first, the manifest last (Note [Staged file sets]).
  std::vector<std::string> names;
  for (const ShardFile& f : r.shards) names.push_back(fs::path(f.path).filename().string());
  names.push_back(manifest_name);
  r.removed = staged.Commit(names);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

int64_t DecodeShard(const std::string& shard_path, const Tokenizer& tokenizer, std::FILE* out) {
  const TokenShard shard = TokenShard::Open(shard_path);
  // One call for the whole shard: a decoder may treat the start of its input specially
  // (SentencePiece drops the first piece's leading space), so pieces would not join up.
  const std::vector<uint32_t> wide = shard.tokens().ToVector();
  const std::vector<int32_t> ids(wide.begin(), wide.end());
  // An id the tokenizer lacks: the shard was made with another one (or with one, and none
  // was given), said before anything is written.
  const auto beyond = std::find_if(
      ids.begin(), ids.end(), [&](int32_t id) { return id < 0 || id >= tokenizer.vocab_size(); });
  ZTRAIN_CHECK_T(ConfigError, beyond == ids.end(), shard_path, " holds token id ",
                 beyond == ids.end() ? 0 : *beyond, " at position ", beyond - ids.begin(),
                 ", beyond this tokenizer's ", tokenizer.vocab_size(), " ids (",
                 tokenizer.kind() == "byte" ? "byte tokens: no --tokenizer was given"
                                            : "the --tokenizer given",
                 "): decode it with the tokenizer that made it (its manifest names it), e.g. "
                 "--tokenizer MODEL_DIR");
  const std::string text = tokenizer.Decode(ids);
  ZTRAIN_CHECK_T(IoError, std::fwrite(text.data(), 1, text.size(), out) == text.size(),
                 "cannot write the decoded text");
  return shard.size();
}

}  // namespace ztrain::data
