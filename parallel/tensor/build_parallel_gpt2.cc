// BuildParallelGpt2 and the checks that a model splits over a tp group.
#include <numeric>
#include <string>

#include "core/error.h"
#include "nn/gpt2.h"
#include "parallel/tensor/tp_common.h"
#include "parallel/tensor/tp_layers.h"

namespace ztrain::tensor {
namespace {

// "1, 2, 3, 4, 6, 12": the tp sizes that split `n` evenly.
std::string Divisors(int64_t n) {
  std::string out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d != 0) continue;
    if (!out.empty()) out += ", ";
    out += std::to_string(d);
  }
  return out;
}

}  // namespace

void CheckTensorParallelModel(const ModelConfig& m, int tp_size) {
  ZTRAIN_CHECK_T(ConfigError, tp_size >= 1, "tensor_parallel.size ", tp_size,
                 " must be at least 1");
  std::vector<std::string> problems;
  const auto add = [&](std::string p) {
    if (!p.empty()) problems.push_back(std::move(p));
  };
  const std::string head_sizes = "use a tensor_parallel.size that divides it (" +
                                 (m.n_head > 0 ? Divisors(m.n_head) : std::string("none")) +
                                 "): each rank runs n_head / size whole attention heads";
  add(detail::DivisibilityProblem("model.n_head", m.n_head, tp_size, head_sizes.c_str()));
  // Implied by the heads whenever n_embd % n_head == 0, but the MLP splits channels too.
  add(detail::DivisibilityProblem("model.n_embd", m.n_embd, tp_size,
                                  "use a tensor_parallel.size that divides it"));
  // The smallest padded size >= vocab_size that the group splits into whole 128-row slices
  // (the GPU-friendly padding "auto" uses), as a suggestion.
  const int64_t step = std::lcm<int64_t>(128, tp_size);
  const int64_t suggested = (m.vocab_size + step - 1) / step * step;
  const std::string vocab_fix =
      "set model.padded_vocab_size to a multiple of the size that is "
      "at least model.vocab_size, e.g. " +
      std::to_string(suggested) + ": each rank holds padded_vocab_size / size embedding rows";
  add(detail::DivisibilityProblem("model.padded_vocab_size", m.padded_vocab_size, tp_size,
                                  vocab_fix.c_str()));
  std::string message;
  for (const std::string& p : problems) message += (message.empty() ? "" : "\n") + p;
  ZTRAIN_CHECK_T(ConfigError, problems.empty(), message);
}

std::vector<std::unique_ptr<nn::Layer>> BuildParallelGpt2(const ModelConfig& m,
                                                          comm::Communicator& tp) {
  if (tp.size() == 1) return nn::BuildGpt2(m);
  ZTRAIN_CHECK(m.type == "gpt2", "model.type '", m.type, "' is not known; use \"gpt2\"");
  CheckTensorParallelModel(m, tp.size());
  std::vector<std::unique_ptr<nn::Layer>> layers;
  layers.push_back(
      std::make_unique<VocabParallelEmbedding>(m.padded_vocab_size, m.max_seq_len, m.n_embd, tp));
  for (int l = 0; l < m.n_layer; ++l) {
    layers.push_back(
        std::make_unique<ParallelTransformerBlock>(l, m.n_layer, m.n_embd, m.n_head, tp));
  }
  layers.push_back(
      std::make_unique<VocabParallelLmHead>(m.vocab_size, m.padded_vocab_size, m.n_embd, tp));
  return layers;
}

}  // namespace ztrain::tensor
