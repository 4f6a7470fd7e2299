#pragma once
// Shared helpers for engine tests: a tiny GPT config and random micro-batches.
#include <random>
#include <vector>

#include "core/config.h"
#include "data/documents.h"
#include "nn/layer.h"

namespace ztrain::testing {

// A GPT-2 shaped model small enough for finite differences.
inline nlohmann::json TinyConfigJson(int n_layer = 2, int n_embd = 8, int n_head = 2,
                                     int vocab = 11, int max_seq = 8) {
  nlohmann::json j = DefaultConfigJson();
  j["model"] = {{"type", "gpt2"},         {"n_layer", n_layer}, {"n_head", n_head},
                {"n_embd", n_embd},       {"vocab_size", vocab}, {"padded_vocab_size", 16},
                {"max_seq_len", max_seq}};
  j["data"] = {{"seq_len", max_seq}};
  return j;
}

// A Llama-family model small enough for finite differences: 4 query heads over 2 KV heads
// (grouped-query attention) of head_dim 4 (not n_embd / n_head), a SwiGLU MLP 12 wide, RoPE,
// an untied head. Callers flip the variants (biases, tying, rope scaling, MQA).
inline nlohmann::json TinyLlamaConfigJson(int n_layer = 2, int vocab = 11, int max_seq = 8) {
  nlohmann::json j = DefaultConfigJson();
  j["model"] = {{"type", "llama"},        {"n_layer", n_layer},     {"n_head", 4},
                {"n_kv_head", 2},         {"head_dim", 4},          {"n_embd", 12},
                {"intermediate_size", 12}, {"vocab_size", vocab},   {"padded_vocab_size", 16},
                {"max_seq_len", max_seq}, {"norm_eps", 1e-5},       {"rope_theta", 100.0},
                {"tie_word_embeddings", false}};
  j["data"] = {{"seq_len", max_seq}};
  return j;
}

// The small GPT-2 of the memory checks (estimate_test, tune_test): 2 blocks, n_embd 64, 4
// heads, vocabulary 512 (padded 512), T 64, on the CPU backend, with `micro` rows per
// micro-batch and `gas` micro-batches per step.
inline nlohmann::json SmallConfigJson(int64_t micro, int gas) {
  nlohmann::json j = DefaultConfigJson();
  j["model"] = {{"type", "gpt2"},   {"n_layer", 2},      {"n_head", 4},
                {"n_embd", 64},     {"vocab_size", 512}, {"padded_vocab_size", 512},
                {"max_seq_len", 64}};
  j["data"] = {{"seq_len", 64}};
  j.erase("train_batch_size");
  j["train_micro_batch_size_per_gpu"] = micro;
  j["gradient_accumulation_steps"] = gas;
  j["device"] = "cpu";
  return j;
}

// A `quantization` section for the equivalence tests' --quant: "nf4", "nf4-dq" (double
// quantization), "fp4" or "int8".
inline nlohmann::json QuantizationJson(const std::string& kind) {
  if (kind == "int8") return {{"load_in_8bit", true}};
  nlohmann::json q = {{"load_in_4bit", true},
                      {"bnb_4bit_quant_type", kind.substr(0, 3)},
                      {"bnb_4bit_use_double_quant", kind == "nf4-dq" || kind == "fp4-dq"}};
  return q;
}

// The document start token of OwnedBatch::Pack and the configs that train on it.
inline constexpr int32_t kPackedStart = 1;

// Owns the token storage behind a MicroBatch.
struct OwnedBatch {
  std::vector<int32_t> tokens, targets, positions;
  nn::MicroBatch mb;
  // Packed documents (Note [Packed documents]): each starting at token kPackedStart, which the
  // random tokens hold about once in `vocab`; marked as the trainer marks them.
  void Pack() {
    const int64_t b = mb.B(), t = mb.T();
    positions.resize(tokens.size());
    data::MarkDocuments({kPackedStart, -1, ""}, b, t, tokens.data(), targets.data(),
                        positions.data());
    mb.positions = Tensor(positions.data(), DType::kI32, {b, t});
  }
  OwnedBatch(int64_t b, int64_t t, int vocab, uint32_t seed) : tokens(b * t), targets(b * t) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> d(0, vocab - 1);
    for (auto& x : tokens) x = d(rng);
    for (auto& x : targets) x = d(rng);
    mb.tokens = Tensor(tokens.data(), DType::kI32, {b, t});
    mb.targets = Tensor(targets.data(), DType::kI32, {b, t});
  }
};

}  // namespace ztrain::testing
