#pragma once
// TrainSampler: a sample printed during training every `training.sample_interval` steps, as
// llm.c prints one, so a user sees what the model has learned.
//
// Each sample gathers the whole model to the first rank (Engine::ForEachModelParameter:
// collective, every rank calls Sample), which builds a Decoder (nn/decoder.h: fp32, CPU, KV
// cache) and generates `sample_tokens` tokens after the model's document tokens and
// `sample_prompt`, at `sample_temperature`, from a stream seeded by training.seed and the step
// The text is decoded with training.tokenizer, else
// model.init_from's tokenizer when it holds one, else byte tokens when the vocabulary is that
// small; otherwise the ids are given. LoRA runs are not sampled (their adapters would need
// merging): the constructor says so. Not thread safe.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/tokenizer.h"
#include "engine/engine.h"

namespace ztrain {

class TrainSampler {
 public:
  explicit TrainSampler(const Config& config);
  ~TrainSampler();
  // Whether the run samples (sample_interval > 0 and not LoRA).
  bool enabled() const { return enabled_; }
  // The sample after `step` on the first rank (the prompt and the generated text), "" on the
  // others. Collective.
  std::string Sample(Engine& engine, int64_t step);

 private:
  Config config_;
  bool enabled_ = false;
  std::unique_ptr<data::Tokenizer> tokenizer_;  // null: print ids
  std::vector<int32_t> prompt_;
};

}  // namespace ztrain
