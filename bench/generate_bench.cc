// Generation's per-token time against the prompt length (Note [KV cache], nn/decoder.h): a
// GPT-2 and a Llama of ~30M parameters (random weights; the time does not depend on them)
// generate 32 tokens after prompts of 16 to 896 tokens. With the cache a new token costs one
// position's projections and MLP plus attention over the cache, so its time should stay
// nearly flat; beside it, the time of one forward over the whole sequence, what each new token
// would cost without a cache (measured in the same run).
//   generate_bench [--threads N]
#include <omp.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/config.h"
#include "nn/decoder.h"

namespace {

using ztrain::bench::Timer;

void Fill(const std::string& name, const ztrain::Tensor& out) {
  const bool norm = name.find("ln") != std::string::npos || name.find("norm") != std::string::npos;
  float* p = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    p[i] = norm ? 1.0f : 0.02f * static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.01f;
  }
}

ztrain::ModelConfig Model(bool llama) {
  nlohmann::json j = ztrain::DefaultConfigJson();
  j["model"] = llama ? nlohmann::json{{"type", "llama"},      {"n_layer", 6},
                                      {"n_head", 8},           {"n_kv_head", 2},
                                      {"n_embd", 512},         {"intermediate_size", 1376},
                                      {"vocab_size", 32000},   {"max_seq_len", 1024},
                                      {"tie_word_embeddings", false}}
                     : nlohmann::json{{"type", "gpt2"},    {"n_layer", 6},
                                      {"n_head", 8},       {"n_embd", 512},
                                      {"vocab_size", 32000}, {"max_seq_len", 1024}};
  j["data"] = {{"seq_len", 1024}};
  return ztrain::ParseConfig(j).model;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--threads") omp_set_num_threads(std::stoi(argv[2]));
  std::printf("generate_bench: 32 greedy tokens after each prompt, %d threads\n",
              omp_get_max_threads());
  for (const bool llama : {false, true}) {
    ztrain::nn::Decoder decoder(Model(llama), Fill);
    ztrain::nn::SamplingOptions o;
    o.max_new_tokens = 32;
    double first = 0;
    std::printf("%s (6 layers, 512 wide, vocabulary 32000):\n", llama ? "Llama" : "GPT-2");
    std::printf("  prompt  ms/new token  vs prompt 16  full forward over the sequence (ms)\n");
    for (const int prompt_len : {16, 128, 512, 896}) {
      std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
      for (int i = 0; i < prompt_len; ++i) prompt[i] = (i * 7919) % 32000;
      decoder.Reset();
      decoder.Step(prompt);  // prefill, not timed
      std::vector<float> logits = decoder.Step(std::vector<int32_t>{1});
      Timer t;
      for (int i = 0; i < o.max_new_tokens; ++i) {
        const int32_t token = ztrain::nn::SampleToken(logits, o, 0.5);
        logits = decoder.Step(std::vector<int32_t>{token});
      }
      const double per_token = t.Seconds() / o.max_new_tokens;
      if (prompt_len == 16) first = per_token;
      decoder.Reset();
      Timer full;
      decoder.Step(prompt);
      const double forward = full.Seconds();
      std::printf("  %6d  %12.2f  %11.2fx  %8.1f (%.0fx a cached token)\n", prompt_len,
                  1e3 * per_token, per_token / first, 1e3 * forward, forward / per_token);
    }
  }
  return 0;
}
