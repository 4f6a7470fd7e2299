#pragma once
// Test helpers for model files: a tiny GPT-2's parameters held by name with known values
// (no engine needed), and a scratch directory.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "nn/gpt2.h"
#include "nn/llmc_model_file.h"

namespace ztrain::testing {

// 2 layers, C = 8, vocab 11 padded to 16, maxT 8.
inline ModelConfig TinyGpt2Config() {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 2;
  m.n_embd = 8;
  m.vocab_size = 11;
  m.padded_vocab_size = 16;
  m.max_seq_len = 8;
  return m;
}

// Every (untied) parameter of BuildGpt2(model) as fp32 values, random in [-2, 2] from `seed`
// so that nearly every value has low mantissa bits that bf16 rounding must handle.
struct StagedGpt2 {
  ModelConfig model;
  std::map<std::string, Shape> shapes;
  std::map<std::string, std::vector<float>> values;

  StagedGpt2(const ModelConfig& m, uint32_t seed) : model(m) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    for (const auto& layer : nn::BuildGpt2(m)) {
      for (const nn::ParamSpec& p : layer->Params()) {
        if (!p.tied_to.empty()) continue;
        shapes[p.name] = p.shape;
        auto& v = values[p.name];
        v.resize(static_cast<size_t>(NumElements(p.shape)));
        for (float& x : v) x = dist(rng);
      }
    }
  }
  int64_t NumParameters() const {
    int64_t n = 0;
    for (const auto& [name, v] : values) n += static_cast<int64_t>(v.size());
    return n;
  }
  nn::ParamLookup Lookup() {
    return [this](const std::string& name) {
      return Tensor(values.at(name).data(), DType::kF32, shapes.at(name));
    };
  }
};

inline std::vector<char> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A fresh directory under /tmp, removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    char tmpl[] = "/tmp/ztrain_nn_XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  // The names of the files in the directory.
  std::vector<std::string> List() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      names.push_back(e.path().filename().string());
    return names;
  }

 private:
  std::string path_;
};

}  // namespace ztrain::testing
