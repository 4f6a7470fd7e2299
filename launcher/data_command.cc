// `ztrain data`: the progress line, the summary, and --decode.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/logging.h"
#include "core/staged_output.h"
#include "data/byte_tokenizer.h"
#include "launcher/commands.h"

namespace ztrain::launcher {
namespace {

std::string Human(double x, const char* unit) {
  const char* prefixes[] = {"", "k", "M", "G", "T"};
  int p = 0;
  while (x >= 1000 && p < 4) {
    x /= 1000;
    ++p;
  }
  char buf[48];
  std::snprintf(buf, sizeof(buf), p == 0 ? "%.0f %s%s" : "%.1f %s%s", x, prefixes[p], unit);
  return buf;
}

std::string Duration(double seconds) {
  char buf[32];
  const long s = static_cast<long>(seconds + 0.5);
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, s / 60 % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  }
  return buf;
}

// A progress line on stderr: redrawn in place on a terminal, a line every 10 s in a log.
class ProgressLine {
 public:
  ProgressLine() : tty_(::isatty(STDERR_FILENO) == 1) {}
  ~ProgressLine() {
    if (drawn_) std::fputc('\n', stderr);
  }

  void operator()(const data::CorpusProgress& p) {
    if (!tty_ && p.seconds - last_ < 10) return;
    last_ = p.seconds;
    const double fraction =
        p.bytes_total > 0 ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total)
                          : 0;
    const double eta = fraction > 0 ? p.seconds * (1 - fraction) / fraction : 0;
    std::fprintf(stderr, "%sdata: %3.0f%% %s of %s, %lld documents, %s, %s/s, ETA %s%s",
                 tty_ ? "\r" : "", 100 * fraction, Human(p.bytes_done, "B").c_str(),
                 Human(p.bytes_total, "B").c_str(), static_cast<long long>(p.documents),
                 Human(p.tokens, "tokens").c_str(),
                 Human(p.tokens / std::max(p.seconds, 1e-9), "tokens").c_str(),
                 Duration(eta).c_str(), tty_ ? "   " : "\n");
    std::fflush(stderr);
    drawn_ = tty_;
  }

 private:
  bool tty_;
  bool drawn_ = false;
  double last_ = 0;
};

// The shards of one split as a data.train / data.val value.
std::string ConfigValue(const data::CorpusReport& r, bool val, const std::string& stem) {
  int n = 0;
  std::string one;
  for (const data::ShardFile& s : r.shards) {
    if (s.val != val) continue;
    ++n;
    one = s.path;
  }
  if (n == 1) return one;
  return stem + (val ? ".val_*.bin" : "_*.bin");
}

}  // namespace

int RunData(data::CorpusOptions options) {
  ProgressLine progress;
  options.on_progress = [&progress](const data::CorpusProgress& p) { progress(p); };
  const data::CorpusReport r = data::TokenizeCorpus(options);
  const std::string stem =
      options.out.size() > 4 && options.out.ends_with(".bin")
          ? options.out.substr(0, options.out.size() - 4)
          : options.out;
  std::printf("wrote %lld %s tokens of %lld documents (%lld file%s, %s) in %.1f s (%s/s):\n",
              static_cast<long long>(r.tokens), data::TokenFormatName(r.format),
              static_cast<long long>(r.documents), static_cast<long long>(r.files),
              r.files == 1 ? "" : "s", Human(static_cast<double>(r.bytes), "B").c_str(),
              r.seconds, Human(r.tokens / std::max(r.seconds, 1e-9), "tokens").c_str());
  for (const bool val : {false, true}) {
    int shards = 0;
    for (const data::ShardFile& s : r.shards) shards += s.val == val ? 1 : 0;
    if (shards == 0) continue;
    const int64_t tokens = val ? r.val_tokens : r.tokens - r.val_tokens;
    std::printf("  %s: %lld tokens in %d shard%s: data.%s = \"%s\"\n", val ? "val  " : "train",
                static_cast<long long>(tokens), shards, shards == 1 ? "" : "s",
                val ? "val" : "train", ConfigValue(r, val, stem).c_str());
  }
  std::printf("  each document: %s (%s)\n", r.document_tokens.layout.c_str(),
              r.document_tokens.source.c_str());
  std::printf("  the model needs vocab_size >= %lld\n", static_cast<long long>(r.vocab_size));
  std::printf("  manifest: %s\n", r.manifest.c_str());
  if (r.invalid_utf8 > 0) {
    Log().warn("{} invalid UTF-8 sequence{} replaced with U+FFFD (the first at {}); "
               "--invalid-utf8 error refuses such input",
               r.invalid_utf8, r.invalid_utf8 == 1 ? " was" : "s were", r.first_invalid);
  }
  for (const std::string& s : r.removed) {
    Log().info("removed {}: a shard of the corpus this one replaced (--overwrite)", s);
  }
  return kExitOk;
}

int RunDecode(const std::string& shard, const std::string& tokenizer, const std::string& out,
              bool overwrite) {
  const bool to_stdout = out.empty() || out == "-";
  // Never onto what it reads (checked before anything is read).
  if (!to_stdout) {
    CheckOutputIsNoInput(out, "--out", {{"the shard --decode reads", shard},
                                        {"--tokenizer", tokenizer}});
  }
  const std::unique_ptr<data::Tokenizer> t = data::LoadTokenizer(tokenizer);
  if (to_stdout) {
    data::DecodeShard(shard, *t, stdout);
    ZTRAIN_CHECK_T(IoError, std::fflush(stdout) == 0, "cannot write the text to stdout");
    return kExitOk;
  }
  // The text appears whole or not at all (Note [Staged outputs]).
  StagedOutput staged(out, StagedOutput::Kind::kFile, overwrite, "--out");
  std::FILE* f = std::fopen(staged.path().c_str(), "wb");
  ZTRAIN_CHECK_T(IoError, f != nullptr, "cannot open '", staged.path(), "' to write the text");
  int64_t tokens = 0;
  try {
    tokens = data::DecodeShard(shard, *t, f);
  } catch (...) {
    std::fclose(f);
    throw;
  }
  const bool written = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  ZTRAIN_CHECK_T(IoError, std::fclose(f) == 0 && written, "cannot write '", staged.path(), "'");
  staged.Commit();
  Log().info("decoded {} tokens of {} to {}", tokens, shard, out);
  return kExitOk;
}

}  // namespace ztrain::launcher
