#pragma once
// What the tests against the PyTorch references (tests/reference/hf_llama.py: HF's Llama,
// PEFT's LoRA) share: finding the python with torch, running the reference, its token file,
// the run config and batches as the reference reads them.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "nn/layer.h"

namespace ztrain::testing {

inline std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// The python that imports torch (CMake's ZTRAIN_TORCH_PYTHON), or "".
inline std::string TorchPython() {
  const std::string python = ZTRAIN_TORCH_PYTHON;
  if (python.empty()) return "";
  const std::string probe = ShellQuote(python) + " -c 'import torch' >/dev/null 2>&1";
  return std::system(probe.c_str()) == 0 ? python : "";
}

inline nlohmann::json ReadJsonFile(const std::filesystem::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// hf_llama.py `args` under `python`, as a test assertion.
inline void RunReference(const std::string& python, const std::string& args) {
  const std::string cmd = ShellQuote(python) + " " +
                          ShellQuote(std::string(ZTRAIN_REFERENCE_DIR) + "/hf_llama.py") + " " +
                          args;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// `steps` batches of `batch` x `seq` token ids below 256 (and one more token), written as raw
// int32 to `file` for the reference, which reads batch k as tokens[k B T, k B T + B T + 1).
class ReferenceTokens {
 public:
  ReferenceTokens(const std::filesystem::path& file, int64_t steps, int64_t batch, int64_t seq,
                  uint32_t seed)
      : batch_(batch), seq_(seq) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> id(0, 255);
    tokens_.resize(static_cast<size_t>(steps * batch * seq + 1));
    for (int32_t& t : tokens_) t = id(rng);
    std::ofstream(file, std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens_.data()),
               static_cast<std::streamsize>(tokens_.size() * sizeof(int32_t)));
  }
  nn::MicroBatch Batch(int64_t k) {
    const int64_t n = batch_ * seq_;
    inputs_.assign(tokens_.begin() + k * n, tokens_.begin() + k * n + n);
    targets_.assign(tokens_.begin() + k * n + 1, tokens_.begin() + k * n + n + 1);
    nn::MicroBatch mb;
    mb.tokens = Tensor(inputs_.data(), DType::kI32, {batch_, seq_});
    mb.targets = Tensor(targets_.data(), DType::kI32, {batch_, seq_});
    return mb;
  }

 private:
  int64_t batch_, seq_;
  std::vector<int32_t> tokens_, inputs_, targets_;
};

// The reference tests' run: one process on the CPU, `batch` x `seq` micro-batches, no
// clipping, AdamW (lr 1e-3, eps 1e-8, weight decay 0.1) at a constant rate, as the
// reference's `train` steps; the model and adapters are the caller's to set.
inline nlohmann::json ReferenceRunJson(int64_t batch, int64_t seq) {
  nlohmann::json j = DefaultConfigJson();
  j["data"] = {{"seq_len", seq}};
  j["train_micro_batch_size_per_gpu"] = batch;
  j["gradient_accumulation_steps"] = 1;
  j["gradient_clipping"] = 0.0;
  j["optimizer"] = {{"type", "AdamW"},
                    {"params",
                     {{"lr", 1e-3}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"weight_decay", 0.1}}}};
  j.erase("scheduler");
  j["device"] = "cpu";
  return j;
}

}  // namespace ztrain::testing
