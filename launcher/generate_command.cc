// `ztrain generate`: text from a model directory, an llm.c model file or a checkpoint, with
// the model's tokenizer (nn/decoder.h: a KV cache, on the CPU).
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_export.h"
#include "core/error.h"
#include "core/logging.h"
#include "data/tokenizer.h"
#include "launcher/commands.h"
#include "run/model_weights.h"
#include "run/run_config.h"

namespace ztrain::launcher {
namespace {

namespace fs = std::filesystem;

// A checkpoint exported to a temporary HF directory (merged when it holds LoRA adapters),
// removed when this goes.
class ExportedCheckpoint {
 public:
  explicit ExportedCheckpoint(const std::string& checkpoint) {
    char tmpl[] = "/tmp/ztrain_generate_XXXXXX";
    ZTRAIN_CHECK_T(IoError, ::mkdtemp(tmpl) != nullptr, "cannot create a temporary directory");
    dir_ = std::string(tmpl) + "/model";
    try {
      ExportCheckpoint(checkpoint, "hf", dir_, DType::kF32, int64_t{1} << 40, false);
    } catch (const ConfigError& e) {
      if (std::string(e.what()).find("LoRA") == std::string::npos) throw;
      fs::remove_all(dir_);
      ExportCheckpoint(checkpoint, "hf", dir_, DType::kF32, int64_t{1} << 40, true);
    }
  }
  ~ExportedCheckpoint() {
    std::error_code ec;
    fs::remove_all(fs::path(dir_).parent_path(), ec);
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// The model config of the weights at `path`, as a run with model.init_from = path reads it.
ModelConfig ModelOf(const std::string& path) {
  const nlohmann::json j = {{"device", "cpu"},
                            {"train_micro_batch_size_per_gpu", 1},
                            {"model", {{"init_from", path}}},
                            {"training", {{"steps", 0}}}};
  LaunchEnv single;
  single.world_size = 1;
  return ResolveRunConfig(j, 1, single).model;
}

std::vector<int32_t> ParseIds(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    try {
      ids.push_back(std::stoi(item));
    } catch (const std::exception&) {
      throw ConfigError(detail::StrCat("--prompt-ids: '", item,
                                       "' is not a token id; give ids separated by commas"));
    }
  }
  return ids;
}

// The tokenizer: --tokenizer, else the model directory when it holds one, else byte tokens.
std::string TokenizerPath(const GenerateArgs& a, const std::string& model_dir) {
  if (!a.tokenizer.empty()) return a.tokenizer;
  std::error_code ec;
  for (const char* file : {"tokenizer.json", "tokenizer.model"}) {
    if (fs::is_directory(model_dir, ec) && fs::exists(fs::path(model_dir) / file, ec)) {
      return model_dir;
    }
  }
  return "";
}

// The tokens that end generation: the end-of-text tokens the tokenizer has (GPT-2, Qwen2,
// Llama-2/3 and their chat forms) and what the model put after each training document.
std::vector<int32_t> StopTokens(const data::Tokenizer& t, const data::DocumentTokens& doc) {
  std::vector<int32_t> stop = doc.after;
  for (const char* name :
       {"<|endoftext|>", "</s>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>"}) {
    if (const int32_t id = t.TokenId(name); id >= 0 && t.kind() != "byte") stop.push_back(id);
  }
  return stop;
}

}  // namespace

int RunGenerate(const GenerateArgs& a) {
  ZTRAIN_CHECK_T(ConfigError, a.model.empty() != a.checkpoint.empty(),
                 "give --model (a Hugging Face directory or an llm.c model file) or "
                 "--checkpoint (a checkpoint directory), one of them");
  std::error_code ec;
  const bool is_checkpoint = !a.model.empty() && fs::is_directory(a.model, ec) &&
                             (fs::exists(fs::path(a.model) / "meta.json", ec) ||
                              fs::exists(fs::path(a.model) / "latest", ec));
  ZTRAIN_CHECK_T(ConfigError, !is_checkpoint, "--model '", a.model,
                 "' is a ztrain checkpoint, not a model; give it as --checkpoint ", a.model);
  std::unique_ptr<ExportedCheckpoint> exported;
  if (!a.checkpoint.empty()) exported = std::make_unique<ExportedCheckpoint>(a.checkpoint);
  const std::string path = exported ? exported->dir() : a.model;
  const ModelConfig model = ModelOf(path);
  // A checkpoint's export holds no tokenizer files unless its run started from a HF model.
  const std::string tokenizer_path = TokenizerPath(a, path);
  const std::unique_ptr<data::Tokenizer> tokenizer = data::LoadTokenizer(tokenizer_path);
  const data::DocumentTokens doc = data::ReadDocumentTokens(tokenizer_path, *tokenizer);
  std::vector<int32_t> prompt;
  if (!a.prompt_ids.empty()) {
    prompt = ParseIds(a.prompt_ids);
  } else {
    prompt = doc.before;  // what each training document started with
    const std::vector<int32_t> text = tokenizer->Encode(a.prompt);
    prompt.insert(prompt.end(), text.begin(), text.end());
  }
  for (const int32_t id : prompt) {
    ZTRAIN_CHECK_T(ConfigError, id >= 0 && id < model.vocab_size, "the prompt has token ", id,
                   ", outside the model's vocabulary of ", model.vocab_size,
                   " (model.vocab_size): is the tokenizer (", tokenizer->vocab_size(),
                   " ids) the model's? Give the model's own with --tokenizer");
  }
  // The model attends over at most max_seq_len positions: the prompt must leave room, and
  // generation stops at the context's end (said before anything is printed).
  const int64_t context = model.max_seq_len, room = context - static_cast<int64_t>(prompt.size());
  ZTRAIN_CHECK_T(ConfigError, room > 0, "the prompt has ", prompt.size(),
                 " tokens, which fills the model's context of ", context,
                 " positions (max_seq_len): give a shorter prompt");
  nn::SamplingOptions o;
  o.max_new_tokens = a.max_new_tokens;
  if (o.max_new_tokens > room) {
    Log().warn(
        "generating at most {} tokens: the model's context is {} positions "
        "(max_seq_len) and the prompt takes {} (asked for --max-new-tokens {})",
        room, context, prompt.size(), a.max_new_tokens);
    o.max_new_tokens = room;
  }
  o.temperature = a.temperature;
  o.top_k = a.top_k;
  o.top_p = a.top_p;
  o.seed = a.seed;
  // Ids the tokenizer has text for; without a tokenizer (byte tokens), --ids keeps every id.
  if (!a.ids || !tokenizer_path.empty()) o.vocab_limit = tokenizer->vocab_size();
  if (!a.ignore_eos) o.stop_tokens = StopTokens(*tokenizer, doc);
  const auto start = std::chrono::steady_clock::now();
  const std::unique_ptr<nn::Decoder> decoder = LoadDecoder(path, model);
  const auto loaded = std::chrono::steady_clock::now();
  if (!a.ids && a.prompt_ids.empty()) std::printf("%s", a.prompt.c_str());
  // Each new token prints what it adds to the text of the whole sequence: a token's text on
  // its own can differ (SentencePiece drops the leading space of a sequence's first piece);
  // a byte-level token may hold part of a character, whose bytes join up on screen.
  std::vector<int32_t> sequence = prompt;
  std::string shown = tokenizer->Decode(sequence);
  const std::vector<int32_t> out = nn::Generate(*decoder, prompt, o, [&](int32_t token) {
    if (a.ids) {
      std::printf("%d\n", token);
    } else {
      sequence.push_back(token);
      std::string text = tokenizer->Decode(sequence);
      const bool extends = text.compare(0, shown.size(), shown) == 0;
      std::printf("%s", extends ? text.c_str() + shown.size()
                                : tokenizer->Decode(std::span<const int32_t>(&token, 1)).c_str());
      shown = std::move(text);
    }
    std::fflush(stdout);
  });
  if (!a.ids) std::printf("\n");
  const double load_s = std::chrono::duration<double>(loaded - start).count();
  const double gen_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - loaded).count();
  Log().info("generated {} tokens after a {}-token prompt in {:.2f} s ({:.1f} ms a token; the "
             "model loaded in {:.2f} s; {}, {})",
             out.size(), prompt.size(), gen_s, 1e3 * gen_s / std::max<size_t>(1, out.size()),
             load_s, o.temperature > 0 ? "sampled" : "greedy",
             tokenizer_path.empty() ? "byte tokens" : tokenizer->kind());
  return kExitOk;
}

}  // namespace ztrain::launcher
