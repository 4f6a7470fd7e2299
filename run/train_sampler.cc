#include "run/train_sampler.h"

#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/logging.h"
#include "data/random.h"
#include "nn/decoder.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;

// training.tokenizer, else model.init_from when it holds a tokenizer, else "" (none).
std::string TokenizerPath(const Config& c) {
  if (!c.training.tokenizer.empty()) return c.training.tokenizer;
  std::error_code ec;
  for (const char* file : {"tokenizer.json", "tokenizer.model"}) {
    if (!c.model.init_from.empty() && fs::exists(fs::path(c.model.init_from) / file, ec)) {
      return c.model.init_from;
    }
  }
  return "";
}

}  // namespace

TrainSampler::TrainSampler(const Config& config) : config_(config) {
  if (config.training.sample_interval <= 0) return;
  if (config.lora.enabled) {
    Log().warn("training.sample_interval: a LoRA run is not sampled while it trains; sample "
               "its checkpoint with `ztrain generate --checkpoint` (merged)");
    return;
  }
  enabled_ = true;
  const std::string path = TokenizerPath(config);
  if (!path.empty() || config.model.vocab_size <= 256) {
    tokenizer_ = data::LoadTokenizer(path);
    prompt_ = data::ReadDocumentTokens(path, *tokenizer_).before;
    const std::vector<int32_t> text = tokenizer_->Encode(config.training.sample_prompt);
    prompt_.insert(prompt_.end(), text.begin(), text.end());
  }
  if (prompt_.empty()) prompt_ = {tokenizer_ ? tokenizer_->Encode("\n").front() : 0};
  ZTRAIN_CHECK_T(ConfigError, static_cast<int64_t>(prompt_.size()) < config.model.max_seq_len,
                 "training.sample_prompt is ", prompt_.size(), " tokens with the document "
                 "tokens, which leaves no room to generate within model.max_seq_len ",
                 config.model.max_seq_len, "; shorten it");
}

TrainSampler::~TrainSampler() = default;

std::string TrainSampler::Sample(Engine& engine, int64_t step) {
  std::map<std::string, std::vector<float>> whole;  // on the first rank only
  engine.ForEachModelParameter([&](const std::string& name, const Tensor& value) {
    const float* p = value.data<float>();
    whole[name].assign(p, p + value.numel());
  });
  if (whole.empty()) return "";
  nn::Decoder decoder(config_.model, [&](const std::string& name, const Tensor& out) {
    const auto it = whole.find(name);
    ZTRAIN_ASSERT(it != whole.end(), "no gathered value of ", name);
    std::copy(it->second.begin(), it->second.end(), out.data<float>());
  });
  nn::SamplingOptions o;
  o.max_new_tokens = std::min(config_.training.sample_tokens,
                              config_.model.max_seq_len - static_cast<int64_t>(prompt_.size()));
  o.temperature = config_.training.sample_temperature;
  o.seed = data::DeriveSeed(config_.training.seed, static_cast<uint64_t>(step));
  if (tokenizer_) o.vocab_limit = tokenizer_->vocab_size();
  const std::vector<int32_t> tokens = nn::Generate(decoder, prompt_, o);
  if (!tokenizer_) {
    std::string ids = "(ids; set training.tokenizer to see text)";
    for (int32_t t : tokens) {
      ids += ' ';
      ids += std::to_string(t);
    }
    return ids;
  }
  std::vector<int32_t> sequence = prompt_;  // one text: a piece's leading space stays
  sequence.insert(sequence.end(), tokens.begin(), tokens.end());
  return tokenizer_->Decode(sequence);
}

}  // namespace ztrain
